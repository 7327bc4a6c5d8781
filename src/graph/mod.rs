//! Where the graph is built: each topology's steps become a petgraph DAG with resolved edges,
//! checked for unknown inputs, illegal edges, cycles and topic loops, and — once the whole
//! commit is valid — given identities (SPEC §3–§4).
//!
//! Edges point from an input to the step that reads it, so topological order is data-flow
//! order. Steps keep the order of a stable topological sort (ties by name), so every output
//! built from a graph is deterministic.

pub mod identity;

use std::collections::{BTreeMap, BTreeSet};

use petgraph::Direction;
use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use serde::Serialize;

use crate::diagnostic::{Code, Diagnostic};
use crate::spec::{
    CutoverMode, DEFAULT_CLUSTER, Endpoint, EnvValue, Located, RepoSpec, Resources, Scale,
    StartFrom, StepDef, TopologySpec, Transform,
};
pub use identity::Identity;
use identity::InputRef;

/// A valid topology: resolved edges, identities, and a deterministic order.
#[derive(Debug, Clone)]
pub struct Topology {
    pub name: String,
    pub cutover: CutoverMode,
    /// The cluster of its sources and sinks, where its internal topics live too.
    pub cluster: String,
    /// Replication factor of its internal and dead-letter topics; `None`: the broker's default.
    pub replication: Option<u32>,
    /// Topic settings of its internal and dead-letter topics.
    pub topic_config: BTreeMap<String, String>,
    /// Its step tests (`plumber test`), as the commit has them.
    pub tests: Vec<crate::spec::step_test::StepTests>,
    graph: DiGraph<Step, ()>,
    /// Topological order, ties broken by step name.
    order: Vec<NodeIndex>,
    by_name: BTreeMap<String, NodeIndex>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    pub file: String,
    pub identity: Identity,
    pub kind: StepKind,
    pub description: Option<String>,
    pub owner: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Source,
    Processor,
    Sink,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    Source {
        topic: String,
    },
    Processor {
        transform: Transform,
        env: BTreeMap<String, EnvValue>,
        partitions: u32,
        scale: Scale,
        resources: Option<Resources>,
        start_from: StartFrom,
    },
    Sink {
        topic: String,
    },
}

/// The directories a checkout of a commit must hold for the processors of `topologies` that
/// run commands there ([`Step::checkout_dir`]).
pub fn checkout_dirs(topologies: &[Topology]) -> std::collections::BTreeSet<String> {
    topologies
        .iter()
        .flat_map(|t| t.steps().filter_map(|(_, step)| step.checkout_dir()))
        .collect()
}

impl Step {
    /// The directory of the step's file, when its processor runs a command there (`exec`,
    /// and `http` servers started locally): what a checkout of its commit must hold.
    pub fn checkout_dir(&self) -> Option<String> {
        match &self.kind {
            StepKind::Processor {
                transform: Transform::Exec { .. } | Transform::Http { .. },
                ..
            } => Some(
                self.file
                    .rsplit_once('/')
                    .map_or_else(String::new, |(dir, _)| dir.to_owned()),
            ),
            _ => None,
        }
    }

    pub fn kind(&self) -> Kind {
        match self.kind {
            StepKind::Source { .. } => Kind::Source,
            StepKind::Processor { .. } => Kind::Processor,
            StepKind::Sink { .. } => Kind::Sink,
        }
    }
}

/// Index of a step within its [`Topology`].
pub type StepId = NodeIndex;

impl Topology {
    /// Steps in topological order.
    pub fn steps(&self) -> impl DoubleEndedIterator<Item = (StepId, &Step)> + '_ {
        self.order.iter().map(|&id| (id, &self.graph[id]))
    }

    pub fn step(&self, id: StepId) -> &Step {
        &self.graph[id]
    }

    pub fn find(&self, name: &str) -> Option<StepId> {
        self.by_name.get(name).copied()
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The steps `id` reads, sorted by name.
    pub fn inputs(&self, id: StepId) -> Vec<StepId> {
        self.neighbours(id, Direction::Incoming)
    }

    /// A join's table: the input step its query reads whole, outside its consumer group.
    pub fn table_input(&self, id: StepId) -> Option<StepId> {
        let StepKind::Processor {
            transform: Transform::Sql {
                table: Some(table), ..
            },
            ..
        } = &self.graph[id].kind
        else {
            return None;
        };
        self.find(&table.step)
    }

    /// The steps `id` reads through its consumer group: its inputs but a join's table.
    pub fn group_inputs(&self, id: StepId) -> Vec<StepId> {
        let table = self.table_input(id);
        self.inputs(id)
            .into_iter()
            .filter(|i| Some(*i) != table)
            .collect()
    }

    /// The steps that read `id`, sorted by name.
    pub fn consumers(&self, id: StepId) -> Vec<StepId> {
        self.neighbours(id, Direction::Outgoing)
    }

    fn neighbours(&self, id: StepId, direction: Direction) -> Vec<StepId> {
        let mut ids: Vec<StepId> = self.graph.neighbors_directed(id, direction).collect();
        ids.sort_by(|a, b| self.graph[*a].name.cmp(&self.graph[*b].name));
        ids.dedup();
        ids
    }

    /// A processor's internal topic, which is also its consumer group:
    /// `plumber.<topology>.<step>.<id12>`. Only processors that feed a processor write one.
    pub fn internal_name(&self, id: StepId) -> String {
        let step = &self.graph[id];
        format!(
            "plumber.{}.{}.{}",
            self.name,
            step.name,
            step.identity.short()
        )
    }

    pub fn dlq_topic(&self, id: StepId) -> String {
        format!("plumber.{}.{}.dlq", self.name, self.graph[id].name)
    }

    /// Whether a processor writes an internal topic (some processor reads it).
    pub fn feeds_processor(&self, id: StepId) -> bool {
        self.consumers(id)
            .iter()
            .any(|&c| self.graph[c].kind() == Kind::Processor)
    }

    /// The topic a step's records are on: a source's or sink's own, or a processor's internal one.
    pub fn topic_of(&self, id: StepId) -> String {
        match &self.graph[id].kind {
            StepKind::Source { topic } | StepKind::Sink { topic } => topic.clone(),
            StepKind::Processor { .. } => self.internal_name(id),
        }
    }

    /// The topics a processor reads, sorted.
    pub fn input_topics(&self, id: StepId) -> Vec<String> {
        sorted(self.inputs(id).into_iter().map(|i| self.topic_of(i)))
    }

    /// The topics a processor writes: its internal topic if it feeds a processor, and the
    /// topics of the sinks it feeds. Sorted.
    pub fn output_topics(&self, id: StepId) -> Vec<String> {
        let mut topics: Vec<String> = self
            .consumers(id)
            .into_iter()
            .filter_map(|c| match &self.graph[c].kind {
                StepKind::Sink { topic } => Some(topic.clone()),
                _ => None,
            })
            .collect();
        if self.feeds_processor(id) {
            topics.push(self.internal_name(id));
        }
        sorted(topics)
    }

    /// All steps downstream of `id` (not including it).
    pub fn descendants(&self, id: StepId) -> BTreeSet<StepId> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![id];
        while let Some(next) = stack.pop() {
            for consumer in self.graph.neighbors_directed(next, Direction::Outgoing) {
                if seen.insert(consumer) {
                    stack.push(consumer);
                }
            }
        }
        seen
    }
}

fn sorted(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut items: Vec<String> = items.into_iter().collect();
    items.sort();
    items.dedup();
    items
}

/// Checks every topology and, if the commit has no errors (including those already in
/// `diagnostics`), returns the graphs with identities.
pub fn build(spec: &RepoSpec, diagnostics: &mut Vec<Diagnostic>) -> Option<Vec<Topology>> {
    let checked: Vec<Checked> = spec
        .topologies
        .iter()
        .map(|t| check(t, spec, diagnostics))
        .collect();
    if diagnostics.iter().any(Diagnostic::is_error) {
        return None;
    }
    checked
        .into_iter()
        .zip(&spec.topologies)
        .map(|(checked, topology)| finish(topology, checked))
        .collect()
}

/// A topology's graph over spec step indices, before identities.
struct Checked {
    graph: DiGraph<usize, ()>,
}

fn check(topology: &TopologySpec, spec: &RepoSpec, diagnostics: &mut Vec<Diagnostic>) -> Checked {
    let mut graph = DiGraph::<usize, ()>::with_capacity(topology.steps.len(), topology.steps.len());
    let nodes: BTreeMap<&str, NodeIndex> = topology
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| (step.name.as_str(), graph.add_node(i)))
        .collect();

    for step in &topology.steps {
        let inputs = match &step.def {
            StepDef::Processor(p) => &p.inputs,
            StepDef::Sink { inputs, .. } => inputs,
            StepDef::Source(_) | StepDef::Unknown => continue,
        };
        let mut seen = BTreeSet::new();
        for input in inputs {
            if !seen.insert(input.value.as_str()) {
                diagnostics.push(Diagnostic::error(
                    Code::InvalidValue,
                    &step.file,
                    Some(input.pos),
                    format!("input `{}` is listed twice", input.value),
                ));
                continue;
            }
            let Some(&from) = nodes.get(input.value.as_str()) else {
                diagnostics.push(unknown_input(topology, &step.file, input));
                continue;
            };
            let from_step = &topology.steps[graph[from]];
            let reads_sink = matches!(from_step.def, StepDef::Sink { .. });
            let sink_reads_source = matches!(step.def, StepDef::Sink { .. })
                && matches!(from_step.def, StepDef::Source(_));
            if reads_sink {
                diagnostics.push(Diagnostic::error(
                    Code::InvalidEdge,
                    &step.file,
                    Some(input.pos),
                    format!(
                        "`{}` is a sink; nothing may read a sink. Read the step that feeds it instead",
                        input.value
                    ),
                ));
            } else if sink_reads_source {
                diagnostics.push(Diagnostic::error(
                    Code::InvalidEdge,
                    &step.file,
                    Some(input.pos),
                    format!(
                        "a sink cannot read source `{}` directly; put a processor between them (`jq: .` copies records)",
                        input.value
                    ),
                ));
            } else if joins_as_table(&step.def, &input.value)
                && !matches!(from_step.def, StepDef::Source(_) | StepDef::Unknown)
            {
                diagnostics.push(Diagnostic::error(
                    Code::InvalidEdge,
                    &step.file,
                    Some(input.pos),
                    format!(
                        "the query joins `{}` as its table, and a table is a source: its topic \
                         is read whole, from its beginning. A processor's topic starts anew when \
                         the processor is replaced, and the table would lose its rows. Write the \
                         table to a topic with a sink (of another topology) and join a source \
                         that reads that topic",
                        input.value
                    ),
                ));
            } else {
                graph.add_edge(from, nodes[step.name.as_str()], ());
            }
        }
    }

    report_cycles(topology, &graph, diagnostics);
    check_topics(topology, spec, diagnostics);
    warn_dead_ends(topology, &graph, diagnostics);
    Checked { graph }
}

/// Whether `def` is a join whose table is its input `input`.
fn joins_as_table(def: &StepDef, input: &str) -> bool {
    matches!(def, StepDef::Processor(p) if matches!(
        &p.transform,
        Some(Transform::Sql { table: Some(table), .. }) if table.step == input
    ))
}

fn unknown_input(topology: &TopologySpec, file: &str, input: &Located<String>) -> Diagnostic {
    let names = topology.steps.iter().map(|s| s.name.as_str());
    let suggestion = crate::spec::fields::closest(&input.value, names)
        .map(|name| format!("; did you mean `{name}`?"))
        .unwrap_or_else(|| {
            format!(
                "; topology `{}` has no step named so (step names are file names)",
                topology.name
            )
        });
    Diagnostic::error(
        Code::UnknownInput,
        file,
        Some(input.pos),
        format!("unknown input `{}`{suggestion}", input.value),
    )
}

/// One `cycle` error per strongly connected component, listing the steps in edge order.
fn report_cycles(
    topology: &TopologySpec,
    graph: &DiGraph<usize, ()>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let name = |n: NodeIndex| topology.steps[graph[n]].name.as_str();
    for component in tarjan_scc(graph) {
        let cyclic = component.len() > 1
            || component
                .first()
                .is_some_and(|&n| graph.find_edge(n, n).is_some());
        if !cyclic {
            continue;
        }
        let members: BTreeSet<NodeIndex> = component.iter().copied().collect();
        let Some(&start) = members.iter().min_by_key(|&&n| name(n)) else {
            continue;
        };
        // Walk edges inside the component from the first step by name until a step repeats.
        let mut chain = vec![start];
        let mut current = start;
        loop {
            let next = graph
                .edges(current)
                .map(|e| e.target())
                .filter(|t| members.contains(t))
                .min_by_key(|&t| name(t));
            let Some(next) = next else { break };
            if let Some(at) = chain.iter().position(|&n| n == next) {
                chain.drain(..at);
                chain.push(next);
                break;
            }
            chain.push(next);
            current = next;
        }
        let path: Vec<&str> = chain.iter().map(|&n| name(n)).collect();
        diagnostics.push(Diagnostic::error(
            Code::Cycle,
            &topology.dir,
            None,
            format!(
                "the steps form a cycle: {}; remove one of these inputs",
                path.join(" → ")
            ),
        ));
    }
}

/// Source topics must not be written by the same topology, and a topology runs on one cluster
/// (unknown clusters are already reported where they are named).
fn check_topics(topology: &TopologySpec, spec: &RepoSpec, diagnostics: &mut Vec<Diagnostic>) {
    let mut read: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    let mut clusters: BTreeMap<&str, (&str, &Endpoint)> = BTreeMap::new();
    for step in &topology.steps {
        if let StepDef::Source(endpoint) = &step.def {
            read.insert((&endpoint.cluster.value, &endpoint.topic.value), &step.name);
        }
        if let StepDef::Source(endpoint) | StepDef::Sink { endpoint, .. } = &step.def
            && spec.settings.clusters.contains_key(&endpoint.cluster.value)
        {
            clusters
                .entry(&endpoint.cluster.value)
                .or_insert((&step.file, endpoint));
        }
    }
    for step in &topology.steps {
        let StepDef::Sink { endpoint, .. } = &step.def else {
            continue;
        };
        if let Some(source) = read.get(&(
            endpoint.cluster.value.as_str(),
            endpoint.topic.value.as_str(),
        )) {
            diagnostics.push(Diagnostic::error(
                Code::TopicLoop,
                &step.file,
                Some(endpoint.topic.pos),
                format!(
                    "topic `{}` is read by source `{source}` of this topology and written by this sink: records would loop",
                    endpoint.topic.value
                ),
            ));
        }
    }
    if clusters.len() > 1 {
        let names: Vec<&str> = clusters.keys().copied().collect();
        for (file, endpoint) in clusters.values().skip(1) {
            diagnostics.push(Diagnostic::error(
                Code::InvalidValue,
                file,
                Some(endpoint.cluster.pos),
                format!(
                    "topology `{}` mixes clusters {}; a topology runs on one cluster",
                    topology.name,
                    names.join(" and ")
                ),
            ));
        }
    }
}

fn warn_dead_ends(
    topology: &TopologySpec,
    graph: &DiGraph<usize, ()>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    // Walk backwards from every sink: whatever is not reached has no path to one.
    let mut reaches_sink = BTreeSet::new();
    let mut stack: Vec<NodeIndex> = graph
        .node_indices()
        .filter(|&n| matches!(topology.steps[graph[n]].def, StepDef::Sink { .. }))
        .collect();
    while let Some(n) = stack.pop() {
        if reaches_sink.insert(n) {
            stack.extend(graph.neighbors_directed(n, Direction::Incoming));
        }
    }
    for n in graph.node_indices() {
        let step = &topology.steps[graph[n]];
        let first_line = Some(crate::spec::yaml::Pos { line: 1, column: 1 });
        match step.def {
            StepDef::Processor(_) if !reaches_sink.contains(&n) => {
                diagnostics.push(Diagnostic::warning(
                    Code::DeadEnd,
                    &step.file,
                    first_line,
                    format!(
                        "processor `{}` has no path to a sink: its records are never written anywhere",
                        step.name
                    ),
                ));
            }
            StepDef::Source(_)
                if graph
                    .neighbors_directed(n, Direction::Outgoing)
                    .next()
                    .is_none() =>
            {
                diagnostics.push(Diagnostic::warning(
                    Code::UnreadSource,
                    &step.file,
                    first_line,
                    format!("source `{}` is not read by any step", step.name),
                ));
            }
            _ => {}
        }
    }
}

/// Identities in topological order, then the final graph. `None` if a step is incomplete,
/// which `check` has already reported.
fn finish(topology: &TopologySpec, checked: Checked) -> Option<Topology> {
    let Checked { graph } = checked;
    let order = stable_toposort(&graph, |n| topology.steps[graph[n]].name.as_str());
    let mut identities: BTreeMap<NodeIndex, Identity> = BTreeMap::new();
    let mut cluster = None;
    for &n in &order {
        let spec = &topology.steps[graph[n]];
        let input_refs = |graph: &DiGraph<usize, ()>| -> Vec<InputRef<'_>> {
            graph
                .neighbors_directed(n, Direction::Incoming)
                .map(|i| {
                    let input = &topology.steps[graph[i]];
                    match input.def {
                        StepDef::Source(_) => InputRef::Source(identities[&i]),
                        _ => InputRef::Processor {
                            name: &input.name,
                            identity: identities[&i],
                        },
                    }
                })
                .collect()
        };
        let identity = match &spec.def {
            StepDef::Source(endpoint) => {
                cluster.get_or_insert_with(|| endpoint.cluster.value.clone());
                identity::source(&endpoint.cluster.value, &endpoint.topic.value)
            }
            StepDef::Sink { endpoint, .. } => {
                cluster.get_or_insert_with(|| endpoint.cluster.value.clone());
                identity::sink(
                    &endpoint.cluster.value,
                    &endpoint.topic.value,
                    &input_refs(&graph),
                )
            }
            StepDef::Processor(p) => {
                let consumers: Vec<&StepDef> = graph
                    .neighbors_directed(n, Direction::Outgoing)
                    .map(|c| &topology.steps[graph[c]].def)
                    .collect();
                let sinks: Vec<(&str, &str)> = consumers
                    .iter()
                    .filter_map(|def| match def {
                        StepDef::Sink { endpoint, .. } => Some((
                            endpoint.cluster.value.as_str(),
                            endpoint.topic.value.as_str(),
                        )),
                        _ => None,
                    })
                    .collect();
                identity::processor(&identity::ProcessorParts {
                    transform: p.transform.as_ref()?,
                    env: &p.env,
                    partitions: p.partitions,
                    inputs: &input_refs(&graph),
                    sinks: &sinks,
                    feeds_processor: consumers
                        .iter()
                        .any(|def| matches!(def, StepDef::Processor(_))),
                })
            }
            StepDef::Unknown => return None,
        };
        identities.insert(n, identity);
    }

    let graph = graph.filter_map(
        |n, &i| {
            let spec = &topology.steps[i];
            let kind = match &spec.def {
                StepDef::Source(e) => StepKind::Source {
                    topic: e.topic.value.clone(),
                },
                StepDef::Sink { endpoint, .. } => StepKind::Sink {
                    topic: endpoint.topic.value.clone(),
                },
                StepDef::Processor(p) => StepKind::Processor {
                    transform: p.transform.clone()?,
                    env: p.env.clone(),
                    partitions: p.partitions,
                    scale: p.scale,
                    resources: p.resources.clone(),
                    start_from: p.start_from,
                },
                StepDef::Unknown => return None,
            };
            Some(Step {
                name: spec.name.clone(),
                file: spec.file.clone(),
                identity: identities[&n],
                kind,
                description: spec.description.clone(),
                owner: spec.owner.clone(),
            })
        },
        |_, _| Some(()),
    );
    // filter_map keeps indices when nothing is removed, which validity guarantees.
    if graph.node_count() != order.len() {
        return None;
    }
    let by_name = order.iter().map(|&n| (graph[n].name.clone(), n)).collect();
    Some(Topology {
        name: topology.name.clone(),
        cutover: topology.cutover,
        cluster: cluster.unwrap_or_else(|| DEFAULT_CLUSTER.to_owned()),
        replication: topology.replication,
        topic_config: topology.topic_config.clone(),
        tests: topology.tests.clone(),
        graph,
        order,
        by_name,
    })
}

/// Kahn's algorithm, always taking the ready step with the smallest name: the same graph
/// gives the same order however its files were listed.
fn stable_toposort<'a>(
    graph: &DiGraph<usize, ()>,
    name: impl Fn(NodeIndex) -> &'a str,
) -> Vec<NodeIndex> {
    let mut indegree: BTreeMap<NodeIndex, usize> = graph
        .node_indices()
        .map(|n| (n, graph.neighbors_directed(n, Direction::Incoming).count()))
        .collect();
    let mut ready: BTreeSet<(&str, NodeIndex)> = indegree
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(&n, _)| (name(n), n))
        .collect();
    let mut order = Vec::with_capacity(graph.node_count());
    while let Some(first) = ready.pop_first() {
        let n = first.1;
        order.push(n);
        for consumer in graph.neighbors_directed(n, Direction::Outgoing) {
            if let Some(d) = indegree.get_mut(&consumer) {
                *d -= 1;
                if *d == 0 {
                    ready.insert((name(consumer), consumer));
                }
            }
        }
    }
    order
}
