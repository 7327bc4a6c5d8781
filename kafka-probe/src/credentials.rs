//! A cluster's credentials as files (SPEC §2): a Kubernetes Secret mounted as a volume, or
//! the directory of `plumber up --kafka-credentials`. Each file is one librdkafka property,
//! named by the file; `ca.crt`, `tls.crt` and `tls.key` (the keys of a Kubernetes TLS
//! Secret) are certificates, given to librdkafka by their path.

use std::path::{Path, PathBuf};

/// Files holding certificates, and the property that takes their path.
const CERTIFICATE_FILES: [(&str, &str); 3] = [
    ("ca.crt", "ssl.ca.location"),
    ("tls.crt", "ssl.certificate.location"),
    ("tls.key", "ssl.key.location"),
];

/// A credentials file larger than this is not a property value.
const MAX_VALUE_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the Kafka credentials in {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} is not a Kafka credential: {problem} (each file holds one librdkafka property \
         named by the file, e.g. sasl.password)",
        path.display()
    )]
    Invalid { path: PathBuf, problem: String },
}

/// The librdkafka properties the files of `dir` hold, sorted by name. Names starting with
/// `.` are skipped: a mounted Secret keeps its versions in `..data` and `..<timestamp>`.
pub fn properties(dir: &Path) -> Result<Vec<(String, String)>, Error> {
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Read { path, source }
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error(dir))? {
        let entry = entry.map_err(read_error(dir))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(Error::Invalid {
                path,
                problem: "its name is not UTF-8".into(),
            });
        };
        // A Secret volume's files are symlinks into `..data`: follow them.
        if name.starts_with('.') || !path.is_file() {
            continue;
        }
        if let Some((_, property)) = CERTIFICATE_FILES.iter().find(|(file, _)| *file == name) {
            out.push((property.to_string(), path.display().to_string()));
            continue;
        }
        let size = std::fs::metadata(&path).map_err(read_error(&path))?.len();
        if size > MAX_VALUE_BYTES {
            return Err(Error::Invalid {
                path,
                problem: format!("{size} bytes is too long for a property value"),
            });
        }
        let bytes = std::fs::read(&path).map_err(read_error(&path))?;
        let Ok(value) = String::from_utf8(bytes) else {
            return Err(Error::Invalid {
                path,
                problem: "its content is not UTF-8".into(),
            });
        };
        // Files written by `echo` end in a newline that is not part of a password.
        let value = value.strip_suffix('\n').unwrap_or(&value);
        let value = value.strip_suffix('\r').unwrap_or(value);
        out.push((name, value.to_owned()));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_become_properties_and_certificates_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sasl.username"), "alice\n").unwrap();
        std::fs::write(dir.path().join("sasl.password"), "s3cr=t").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "-----BEGIN CERTIFICATE-----").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join("..data").join("x"), "ignored").unwrap();
        let props = properties(dir.path()).unwrap();
        assert_eq!(
            props,
            vec![
                ("sasl.password".to_owned(), "s3cr=t".to_owned()),
                ("sasl.username".to_owned(), "alice".to_owned()),
                (
                    "ssl.ca.location".to_owned(),
                    dir.path().join("ca.crt").display().to_string()
                ),
            ]
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let error = properties(Path::new("/nonexistent/creds")).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/creds"), "{error}");
    }
}
