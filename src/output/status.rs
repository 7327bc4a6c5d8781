//! `plumber status` and `plumber history` for a terminal, from the daemon's JSON answers.

use serde_json::Value;

use super::short_commit;

fn commit(value: &Value) -> &str {
    value.as_str().map_or("-", short_commit)
}

/// The status document (`GET /api/status`) as a table per topology.
pub fn text(status: &Value) -> String {
    let mut out = format!(
        "branch {} at {}  phase {}\n",
        status["branch"].as_str().unwrap_or("?"),
        commit(&status["commit"]),
        status["phase"].as_str().unwrap_or("?")
    );
    let last_error = status["lastError"]["message"].as_str();
    if let Some(error) = status["lastError"].as_object() {
        out.push_str(&format!(
            "last error: {}\n",
            error.get("message").and_then(Value::as_str).unwrap_or("?")
        ));
    }
    if let Some(signature) = status["signature"].as_object() {
        let message = signature.get("message").and_then(Value::as_str);
        let verdict = signature.get("verdict").and_then(Value::as_str);
        // A refused head is the last error already: name the verdict, not the same text twice.
        match (message, verdict) {
            (Some(message), Some(verdict)) if Some(message) == last_error => {
                out.push_str(&format!("signature: refused ({verdict})\n"));
            }
            (message, _) => out.push_str(&format!("signature: {}\n", message.unwrap_or("?"))),
        }
    }
    for topology in status["topologies"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n{}  at {}  {}",
            topology["name"].as_str().unwrap_or("?"),
            commit(&topology["commit"]),
            topology["phase"].as_str().unwrap_or("?")
        ));
        let cutover = topology["cutover"].as_object();
        if let Some(cutover) = cutover {
            out.push_str(&format!(
                " to {} ({} done, {} left{})",
                commit(&cutover["to"]),
                cutover["done"],
                cutover["remaining"],
                cutover
                    .get("current")
                    .and_then(Value::as_str)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default()
            ));
        }
        out.push('\n');
        let actions = cutover
            .and_then(|c| c.get("actions"))
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty());
        // Action by action when the daemon lists them, else what waits.
        for action in actions.into_iter().flatten() {
            let reason = action["reason"]
                .as_str()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {:<8} {}{reason}\n",
                action["state"].as_str().unwrap_or("?"),
                action["action"].as_str().unwrap_or("?"),
            ));
        }
        let waits = cutover
            .and_then(|c| c.get("waiting"))
            .and_then(Value::as_array)
            .filter(|_| actions.is_none());
        for wait in waits.into_iter().flatten() {
            out.push_str(&format!(
                "  waiting: {}: {}\n",
                wait["action"].as_str().unwrap_or("?"),
                wait["reason"].as_str().unwrap_or("?")
            ));
        }
        if let Some(error) = topology["lastError"].as_str() {
            out.push_str(&format!("  error: {error}\n"));
        }
        let steps: Vec<[String; 8]> = topology["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                [
                    s["name"].as_str().unwrap_or("?").to_owned(),
                    s["transform"]
                        .as_str()
                        .or(s["kind"].as_str())
                        .unwrap_or("?")
                        .to_owned(),
                    s["state"].as_str().unwrap_or("?").to_owned(),
                    s["replicas"]
                        .as_u64()
                        .map(|r| r.to_string())
                        .unwrap_or_default(),
                    s["lag"].as_i64().map(|l| l.to_string()).unwrap_or_default(),
                    s["recordsPerSecond"]
                        .as_f64()
                        .map(|r| format!("{r:.1}"))
                        .unwrap_or_default(),
                    s["identity"]
                        .as_str()
                        .map(|i| i.chars().take(12).collect())
                        .unwrap_or_default(),
                    s["group"].as_str().unwrap_or_default().to_owned(),
                ]
            })
            .collect();
        out.push_str(&table(
            [
                "STEP", "KIND", "STATE", "REPLICAS", "LAG", "REC/S", "IDENTITY", "GROUP",
            ],
            &steps,
        ));
    }
    out
}

/// The history (`GET /api/history`), newest first, with cutover offsets.
pub fn history_text(history: &Value) -> String {
    let mut out = String::new();
    let entries: Vec<&Value> = history.as_array().into_iter().flatten().rev().collect();
    if entries.is_empty() {
        return "no cutover applied yet\n".into();
    }
    for entry in entries {
        out.push_str(&format!(
            "{}  {} → {}  {}  {} actions  {}\n",
            entry["topology"].as_str().unwrap_or("?"),
            commit(&entry["from"]),
            commit(&entry["to"]),
            entry["outcome"].as_str().unwrap_or("applied"),
            entry["actions"],
            when(&entry["startedAt"], &entry["finishedAt"])
        ));
        for handover in entry["handovers"].as_array().into_iter().flatten() {
            let offsets: Vec<String> = handover["offsets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| {
                    format!(
                        "{}/{}@{}",
                        o["topic"].as_str().unwrap_or("?"),
                        o["partition"],
                        o["offset"]
                    )
                })
                .collect();
            out.push_str(&format!(
                "  {}: {} → {} at {}\n",
                handover["step"].as_str().unwrap_or("?"),
                handover["fromGroup"].as_str().unwrap_or("?"),
                handover["toGroup"].as_str().unwrap_or("?"),
                if offsets.is_empty() {
                    "-".into()
                } else {
                    offsets.join(" ")
                }
            ));
        }
    }
    out
}

/// `2026-11-30T05:39:46Z (3 s)` from Unix seconds.
fn when(started: &Value, finished: &Value) -> String {
    let (Some(started), Some(finished)) = (started.as_u64(), finished.as_u64()) else {
        return String::new();
    };
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(finished);
    format!(
        "{} ({} s)",
        humantime::format_rfc3339_seconds(at),
        finished.saturating_sub(started)
    )
}

fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect();
        format!("  {}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_cutover_says_what_it_waits_for() {
        let status = serde_json::json!({
            "branch": "main", "commit": "0123456789abcdef", "phase": "cutover",
            "lastError": null,
            "topologies": [{
                "name": "t", "commit": "aaaaaaaaaaaa0000", "phase": "cutover",
                "cutover": {
                    "to": "bbbbbbbbbbbb0000", "done": 3, "remaining": 2,
                    "current": "drain-processor plumber.t.b.1 on plumber.t.a.1",
                    "waiting": [{"action": "start-processor l as plumber.t.l.2",
                                 "reason": "topic late does not exist yet", "failures": 0}]
                },
                "steps": [{"name": "b", "kind": "processor", "state": "running", "lag": 7,
                           "identity": "1111111111112222", "group": "plumber.t.b.111111111111.2"}]
            }]
        });
        let text = text(&status);
        assert!(text.contains("(3 done, 2 left: drain-processor"), "{text}");
        assert!(
            text.contains(
                "waiting: start-processor l as plumber.t.l.2: topic late does not exist yet"
            ),
            "{text}"
        );
        assert!(text.contains("plumber.t.b.111111111111.2"), "{text}");
    }

    #[test]
    fn a_cutover_is_shown_action_by_action_with_replicas_and_rates() {
        let status = serde_json::json!({
            "branch": "main", "commit": "0123456789abcdef", "phase": "cutover",
            "topologies": [{
                "name": "t", "commit": "aaaaaaaaaaaa0000", "phase": "cutover",
                "cutover": {
                    "to": "bbbbbbbbbbbb0000", "done": 1, "remaining": 2, "waiting": [],
                    "actions": [
                        {"action": "start-processor b as g2", "state": "done", "reason": null},
                        {"action": "drain-processor g1 on x", "state": "waiting",
                         "reason": "lag 4"},
                        {"action": "stop-processor g1", "state": "pending",
                         "reason": "waits for drain-processor g1 on x"}
                    ]
                },
                "steps": [{"name": "b", "kind": "processor", "transform": "jq",
                           "state": "running", "lag": 7, "replicas": 2,
                           "recordsPerSecond": 12.34, "identity": "1111", "group": "g2"}]
            }]
        });
        let text = text(&status);
        assert!(
            text.contains("  done     start-processor b as g2\n"),
            "{text}"
        );
        assert!(
            text.contains("  waiting  drain-processor g1 on x: lag 4\n"),
            "{text}"
        );
        assert!(
            text.contains("  pending  stop-processor g1: waits for drain-processor"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("b "))
            .unwrap_or("");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["b", "jq", "running", "2", "7", "12.3", "1111", "g2"],
            "{text}"
        );
    }
}
