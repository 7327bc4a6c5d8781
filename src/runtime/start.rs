//! What a planned start runs: a start action of the plan, on its cluster and towards its
//! target commit, becomes the [`ProcessorSpec`] any runtime runs.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Cluster, ProcessorSpec, Settings};
use crate::graph::{StepKind, Topology};
use crate::plan::StartProcessor;
use crate::plan::deployment::{base_name, handoff_group};
use crate::spec::Transform;

/// The target of a move: a commit's graph of the topology (`None`: the topology is gone).
pub struct Target<'a> {
    pub commit: &'a str,
    pub topology: Option<&'a Topology>,
    /// The cluster the target runs on; `None` with the topology gone (its lives stay where
    /// they run).
    pub cluster: Option<&'a Cluster>,
    /// How the processors started towards it run.
    pub settings: Settings,
}

impl ProcessorSpec {
    /// What a start action runs on `cluster`, towards `target` (also what `plumber render`
    /// renders).
    pub fn starting(
        topology: &str,
        start: &StartProcessor,
        cluster: &Cluster,
        target: &Target<'_>,
    ) -> ProcessorSpec {
        let dir = target
            .topology
            .and_then(|t| t.find(&start.step).map(|id| t.step(id)))
            .and_then(|step| {
                Path::new(&step.file)
                    .parent()
                    .map(|d| d.display().to_string())
            })
            .unwrap_or_default();
        ProcessorSpec {
            topology: topology.to_owned(),
            step: start.step.clone(),
            identity: start.identity,
            group: start.group.clone(),
            cluster: cluster.clone(),
            inputs: start.inputs.iter().map(|i| i.topic.clone()).collect(),
            input_steps: input_steps(start, target),
            outputs: start.outputs.clone(),
            dlq: start.dlq.clone(),
            transform: start.transform.clone(),
            env: start.env.clone(),
            scale: start.scale,
            resources: start.resources.clone(),
            commit: target.commit.to_owned(),
            dir,
            settings: target.settings,
            state: start.state.clone(),
            table: start.table.clone(),
            handoff_group: None,
        }
    }

    /// The same processor started warm (`start-warm`): it holds its partitions until the
    /// engine hands it their start through its hand-off group.
    pub fn warm(mut self) -> ProcessorSpec {
        self.handoff_group = Some(handoff_group(&self.group));
        self
    }
}

/// The topic each input step of a `sql` step is read from (see [`ProcessorSpec::input_steps`]):
/// a source's topic, or the internal topic of the processor's life among the start's inputs.
fn input_steps(start: &StartProcessor, target: &Target<'_>) -> BTreeMap<String, String> {
    let (Transform::Sql { .. }, Some(topology)) = (&start.transform, target.topology) else {
        return BTreeMap::new();
    };
    let Some(id) = topology.find(&start.step) else {
        return BTreeMap::new();
    };
    let mut steps = BTreeMap::new();
    for input in topology.inputs(id) {
        let step = topology.step(input);
        let topic = match &step.kind {
            StepKind::Source { topic } => Some(topic.clone()),
            StepKind::Processor { .. } => {
                let base = base_name(&topology.name, &step.name, step.identity);
                start
                    .inputs
                    .iter()
                    .map(|i| &i.topic)
                    .find(|t| {
                        t.strip_prefix(&base)
                            .is_some_and(|life| life.is_empty() || life.starts_with('.'))
                    })
                    .cloned()
            }
            StepKind::Sink { .. } => None,
        };
        if let Some(topic) = topic {
            steps.insert(step.name.clone(), topic);
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Action, Deployment, moves};
    use crate::spec::{FileContent, SourceFile};

    fn topology(steps: &[(&str, &str)]) -> Topology {
        let files: Vec<SourceFile> = steps
            .iter()
            .map(|(name, yaml)| SourceFile {
                path: format!("topologies/t/{name}.yaml"),
                content: FileContent::Bytes(yaml.as_bytes().to_vec()),
            })
            .collect();
        let validation = crate::validate(&files);
        let errors: Vec<_> = validation.errors().collect();
        assert!(errors.is_empty(), "{errors:?}");
        validation.topologies.unwrap_or_default().remove(0)
    }

    #[test]
    fn sql_steps_learn_the_topic_of_each_input_step() {
        let topology = topology(&[
            ("cars", "kind: source\ntopic: cars.raw\n"),
            ("trucks", "kind: source\ntopic: trucks.raw\n"),
            (
                "fast-trucks",
                "kind: processor\ninput: trucks\njq: 'select(.v > 1)'\n",
            ),
            (
                "both",
                "kind: processor\ninput: [cars, fast-trucks]\nsql: SELECT id FROM cars UNION ALL SELECT id FROM \"fast-trucks\"\n",
            ),
            ("out", "kind: sink\ntopic: out\ninput: both\n"),
        ]);
        let cluster = Cluster::at("b:9092");
        let target = Target {
            commit: "c",
            topology: Some(&topology),
            cluster: Some(&cluster),
            settings: Settings::default(),
        };
        let actions = moves::plan("t", &Deployment::default(), Some(&topology));
        let starts: Vec<&StartProcessor> = actions
            .iter()
            .filter_map(|a| match a {
                Action::StartProcessor(start) => Some(&**start),
                _ => None,
            })
            .collect();
        let both = starts.iter().find(|s| s.step == "both").unwrap();
        let spec = ProcessorSpec::starting("t", both, &cluster, &target);
        let fast = topology.step(topology.find("fast-trucks").unwrap());
        assert_eq!(
            spec.input_steps,
            BTreeMap::from([
                ("cars".to_owned(), "cars.raw".to_owned()),
                (
                    "fast-trucks".to_owned(),
                    base_name("t", "fast-trucks", fast.identity)
                ),
            ])
        );
        // Other transforms need no map.
        let jq = starts.iter().find(|s| s.step == "fast-trucks").unwrap();
        assert!(
            ProcessorSpec::starting("t", jq, &cluster, &target)
                .input_steps
                .is_empty()
        );
    }
}
