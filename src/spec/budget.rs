//! What one commit may make the daemon read and write (SPEC §11).
//!
//! Anyone who can push a watched ref (by default every branch and pull request) chooses what
//! the daemon reads from git: 3,000 step files naming one 1 MiB blob are a push of about
//! 1 MB and, read and parsed, gigabytes of memory. So every commit is measured from its trees
//! (entries and the sizes git records for blobs) before any blob is read, and a commit over
//! budget is a validation error of that commit alone: nothing of it is read, what runs keeps
//! running, and other refs are not affected.

use crate::diagnostic::{Code, Diagnostic};

/// The limits, with what the daemon was given (`plumber up --max-commit-*`, the daemon
/// configuration's `commitBudget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Files under `topologies/` (every blob, YAML or not: each is walked).
    pub files: u64,
    /// Bytes of YAML files (step files, `topology.yaml`, `plumber.yaml`): what is read and
    /// parsed.
    pub bytes: u64,
    /// YAML files under `topologies/` (steps and `topology.yaml`s).
    pub steps: u64,
    /// Topology directories.
    pub topologies: u64,
    /// Bytes a checkout of a commit (the directories `exec` and `http` steps run in) may
    /// write.
    pub checkout_bytes: u64,
}

impl Default for Budget {
    /// Far above a large repository (the scaling benchmarks run 1,000 topologies of 20
    /// steps, about 20,000 files and 4 MB of YAML), far below what hurts a daemon with a
    /// 1 GiB memory limit.
    fn default() -> Self {
        Budget {
            files: 100_000,
            bytes: 32 * 1024 * 1024,
            steps: 50_000,
            topologies: 2_000,
            checkout_bytes: 256 * 1024 * 1024,
        }
    }
}

/// What a commit (or one topology directory of it) holds, from its trees alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measure {
    pub files: u64,
    pub bytes: u64,
    pub steps: u64,
    pub topologies: u64,
}

impl std::ops::AddAssign for Measure {
    fn add_assign(&mut self, other: Measure) {
        self.files += other.files;
        self.bytes += other.bytes;
        self.steps += other.steps;
        self.topologies += other.topologies;
    }
}

/// A limit a commit is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// `files`, `bytes`, `steps`, `topologies` or `checkout bytes`.
    pub limit: &'static str,
    pub found: u64,
    pub allowed: u64,
    /// The flag of `plumber up` and the key of the daemon's configuration that raise it.
    pub flag: &'static str,
    pub key: &'static str,
    /// The topology directory that holds the most of it, if one is named.
    pub largest: Option<String>,
}

impl Exceeded {
    /// The validation error of a commit over budget: not about one line of one file.
    pub fn diagnostic(&self) -> Diagnostic {
        let file = self
            .largest
            .clone()
            .unwrap_or_else(|| super::TOPOLOGIES_DIR.to_owned());
        let noun = match self.limit {
            "bytes" | "checkout bytes" => "bytes",
            other => other,
        };
        let what = match self.limit {
            "files" => "files under topologies/",
            "bytes" => "bytes of YAML",
            "steps" => "step files",
            "topologies" => "topology directories",
            _ => "bytes to check out for exec and http steps",
        };
        let largest = self
            .largest
            .as_ref()
            .map(|dir| format!(" ({dir} holds the most)"))
            .unwrap_or_default();
        Diagnostic::error(
            Code::OverBudget,
            &file,
            None,
            format!(
                "the commit has {} {what}{largest}, over the budget of {} {noun} per commit; \
                 nothing of it was read. Make the change smaller, or raise the budget \
                 (`plumber up {}`, `commitBudget.{}` in the daemon's configuration)",
                self.found, self.allowed, self.flag, self.key
            ),
        )
    }
}

impl Budget {
    /// The first limit `measure` is over (`largest`: the topology directory with the most).
    pub fn check(&self, measure: &Measure, largest: Option<&str>) -> Result<(), Exceeded> {
        let limits = [
            (
                "topologies",
                measure.topologies,
                self.topologies,
                "--max-commit-topologies",
                "topologies",
            ),
            (
                "files",
                measure.files,
                self.files,
                "--max-commit-files",
                "files",
            ),
            (
                "steps",
                measure.steps,
                self.steps,
                "--max-commit-steps",
                "steps",
            ),
            (
                "bytes",
                measure.bytes,
                self.bytes,
                "--max-commit-bytes",
                "bytes",
            ),
        ];
        for (limit, found, allowed, flag, key) in limits {
            if found > allowed {
                return Err(Exceeded {
                    limit,
                    found,
                    allowed,
                    flag,
                    key,
                    largest: largest.map(str::to_owned),
                });
            }
        }
        Ok(())
    }

    /// Whether a checkout of `bytes` may be written.
    pub fn check_checkout(&self, bytes: u64, largest: Option<&str>) -> Result<(), Exceeded> {
        if bytes > self.checkout_bytes {
            return Err(Exceeded {
                limit: "checkout bytes",
                found: bytes,
                allowed: self.checkout_bytes,
                flag: "--max-checkout-bytes",
                key: "checkoutBytes",
                largest: largest.map(str::to_owned),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_limit_over_is_named_with_how_to_raise_it() {
        let budget = Budget {
            files: 10,
            bytes: 100,
            steps: 5,
            topologies: 2,
            checkout_bytes: 1000,
        };
        let within = Measure {
            files: 10,
            bytes: 100,
            steps: 5,
            topologies: 2,
        };
        assert_eq!(budget.check(&within, None), Ok(()));
        let over = Measure {
            bytes: 3_000_000_000,
            ..within
        };
        let exceeded = budget
            .check(&over, Some("topologies/bomb"))
            .expect_err("over");
        assert_eq!(exceeded.limit, "bytes");
        let diagnostic = exceeded.diagnostic();
        assert_eq!(diagnostic.code, Code::OverBudget);
        assert_eq!(diagnostic.file, "topologies/bomb");
        assert!(
            diagnostic.message.contains("3000000000 bytes of YAML")
                && diagnostic.message.contains("--max-commit-bytes")
                && diagnostic.message.contains("commitBudget.bytes"),
            "{}",
            diagnostic.message
        );
        assert!(budget.check_checkout(1001, None).is_err());
    }
}
