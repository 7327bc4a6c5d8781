//! Who owns a file, from a GitHub `CODEOWNERS` file: the owners of the last rule that matches
//! (a rule without owners makes a path unowned). Pure: the text in, owners out; reading the
//! file from a commit is [`crate::repo::Repository::codeowners`].

/// Where GitHub looks for the file, in its order: the first one found is used.
pub const LOCATIONS: [&str; 3] = [".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS"];

#[derive(Clone)]
pub struct CodeOwners {
    /// Where the file was found, relative to the git repository's root.
    pub file: String,
    rules: codeowners_rs::RuleSet,
    /// Where the topology repository starts inside the git repository (`""`, or `dir/`):
    /// CODEOWNERS patterns are relative to the git root, step files to the topology
    /// repository.
    prefix: String,
}

impl std::fmt::Debug for CodeOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeOwners")
            .field("file", &self.file)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl CodeOwners {
    /// Parses the file as GitHub does: lines it cannot read (an invalid owner, say) are
    /// skipped, the others apply.
    pub fn parse(file: &str, text: &str) -> Self {
        CodeOwners {
            file: file.to_owned(),
            rules: codeowners_rs::parse(text).into_ruleset(),
            prefix: String::new(),
        }
    }

    /// For a topology repository at `prefix` (`dir/`, or `""` at the git root).
    pub fn within(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// The owners of a file given relative to the topology repository, as written in
    /// CODEOWNERS (`@org/team`, `@user`, an email); empty when nobody owns it.
    pub fn owners_of(&self, path: &str) -> Vec<String> {
        let path = format!("{}{path}", self.prefix);
        self.rules
            .owners(&path)
            .map(|owners| owners.iter().map(|o| o.value.clone()).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# comment
*                         @acme/everyone
/topologies/*/sinks/      @acme/data-engineering
/topologies/*/steps/*     @acme/data-science
*.sql.yaml                dba@example.com @acme/dba
/topologies/orphans/
";

    fn owners(path: &str) -> Vec<String> {
        CodeOwners::parse("CODEOWNERS", FILE).owners_of(path)
    }

    #[test]
    fn the_last_matching_rule_wins() {
        assert_eq!(owners("README.md"), ["@acme/everyone"]);
        assert_eq!(
            owners("topologies/t/sinks/out.yaml"),
            ["@acme/data-engineering"]
        );
        assert_eq!(owners("topologies/t/steps/a.yaml"), ["@acme/data-science"]);
        assert_eq!(
            owners("topologies/t/steps/q.sql.yaml"),
            ["dba@example.com", "@acme/dba"]
        );
    }

    #[test]
    fn a_trailing_star_matches_direct_children_only() {
        // `/topologies/*/steps/*` does not reach into subdirectories of steps/ (GitHub's rule,
        // unlike .gitignore), so the earlier `*` applies.
        assert_eq!(
            owners("topologies/t/steps/deeper/a.yaml"),
            ["@acme/everyone"]
        );
    }

    #[test]
    fn a_rule_without_owners_leaves_files_unowned() {
        assert!(owners("topologies/orphans/steps/a.yaml").is_empty());
    }

    #[test]
    fn paths_are_matched_from_the_git_root() {
        let owners = CodeOwners::parse("CODEOWNERS", "/repo/topologies/ @acme/sub\n");
        assert!(owners.owners_of("topologies/t/a.yaml").is_empty());
        assert_eq!(
            owners.within("repo/").owners_of("topologies/t/a.yaml"),
            ["@acme/sub"]
        );
    }
}
