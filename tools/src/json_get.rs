//! `json get`: values of a JSON document by path, for the scripts' conditions and messages (the
//! `records` of a model, the `setup.group` of a chaos report, a run's stats), so that no script
//! parses JSON itself.
//!
//! Invariant: a path that is absent is an error that names it, never an empty value a script
//! would go on with. Several paths print their values on one line, separated by spaces, in the
//! order given (for `read -r a b c`).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

/// `json` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct JsonArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: JsonCommand,
}

/// `json` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum JsonCommand {
    /// Print the values at PATHs (dotted: `setup.group`, `stats.records`; a number indexes an
    /// array): a string as it is, anything else as JSON, on one line separated by spaces.
    Get(GetArgs),
}

/// `json get` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct GetArgs {
    /// The JSON file; `-` reads stdin.
    pub file: PathBuf,
    /// Dotted paths into the document.
    #[arg(required = true)]
    pub paths: Vec<String>,
}

/// Runs a `json` subcommand.
pub fn run(args: &JsonArgs) -> Result<()> {
    match &args.command {
        JsonCommand::Get(a) => {
            let text = if a.file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .context("reading stdin")?;
                s
            } else {
                std::fs::read_to_string(&a.file)
                    .with_context(|| format!("reading {}", a.file.display()))?
            };
            let doc: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", a.file.display()))?;
            let values = a
                .paths
                .iter()
                .map(|p| {
                    get(&doc, p)
                        .map(text_of)
                        .with_context(|| format!("{} has no value at {p}", a.file.display()))
                })
                .collect::<Result<Vec<_>>>()?;
            println!("{}", values.join(" "));
            Ok(())
        }
    }
}

/// The value at dotted `path` in `doc` (`None` when absent); the empty path is the document.
pub fn get<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|s| !s.is_empty())
        .try_fold(doc, |v, segment| match v {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
            _ => None,
        })
}

/// How a value is printed: a string without its quotes, anything else as compact JSON.
pub fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dotted_paths_reach_objects_and_arrays() {
        let doc = json!({"setup": {"group": "chaos-1"}, "stats": {"records": 20000},
                         "list": [{"a": 1}, {"a": 2}]});
        assert_eq!(get(&doc, "setup.group"), Some(&json!("chaos-1")));
        assert_eq!(get(&doc, "stats.records"), Some(&json!(20000)));
        assert_eq!(get(&doc, "list.1.a"), Some(&json!(2)));
        assert_eq!(get(&doc, ""), Some(&doc));
    }

    #[test]
    fn an_absent_path_is_none() {
        let doc = json!({"records": 3, "list": [1]});
        assert_eq!(get(&doc, "record"), None);
        assert_eq!(get(&doc, "records.x"), None);
        assert_eq!(get(&doc, "list.1"), None);
        assert_eq!(get(&doc, "list.x"), None);
    }

    #[test]
    fn strings_print_bare_and_the_rest_as_json() {
        assert_eq!(text_of(&json!("a b")), "a b");
        assert_eq!(text_of(&json!(12)), "12");
        assert_eq!(text_of(&json!(0.5)), "0.5");
        assert_eq!(text_of(&json!(true)), "true");
        assert_eq!(text_of(&json!(null)), "null");
        assert_eq!(text_of(&json!({"k": [1]})), r#"{"k":[1]}"#);
    }
}
