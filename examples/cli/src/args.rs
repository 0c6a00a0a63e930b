//! A small command-line parser: `--flag VALUE`, `--flag=VALUE`, `-n VALUE`,
//! switches, and positional arguments. Unknown flags are errors.

use std::collections::HashMap;
use std::str::FromStr;

/// Parsed arguments of one subcommand.
#[derive(Debug, Default)]
pub struct Args {
    values: HashMap<&'static str, Vec<String>>,
    switches: Vec<&'static str>,
    positional: Vec<String>,
}

/// What a subcommand accepts: flags that take a value, and switches.
pub struct Spec {
    pub values: &'static [&'static str],
    pub switches: &'static [&'static str],
}

impl Args {
    pub fn parse(argv: &[String], spec: &Spec) -> Result<Args, String> {
        Self::parse_multi(argv, &[spec])
    }

    /// Parse with the union of several specs (shared option groups).
    pub fn parse_multi(argv: &[String], specs: &[&Spec]) -> Result<Args, String> {
        let mut a = Args::default();
        let mut i = 0;
        while i < argv.len() {
            let arg = &argv[i];
            i += 1;
            if arg == "--" {
                a.positional.extend(argv[i..].iter().cloned());
                break;
            }
            if !arg.starts_with('-') || arg == "-" || arg.parse::<f64>().is_ok() {
                a.positional.push(arg.clone());
                continue;
            }
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (arg.as_str(), None),
            };
            let find = |list: fn(&Spec) -> &'static [&'static str]| {
                specs.iter().flat_map(|s| list(s).iter()).find(|&&f| f == name).copied()
            };
            if let Some(flag) = find(|s| s.values) {
                let v = match inline {
                    Some(v) => v,
                    None => {
                        let v = argv.get(i).ok_or_else(|| format!("{flag} needs a value"))?;
                        i += 1;
                        v.clone()
                    }
                };
                a.values.entry(flag).or_default().push(v);
            } else if let Some(flag) = find(|s| s.switches) {
                if inline.is_some() {
                    return Err(format!("{flag} takes no value"));
                }
                a.switches.push(flag);
            } else {
                return Err(format!("unknown option {name}"));
            }
        }
        Ok(a)
    }

    /// The last value given for `flag`.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.values.get(flag).and_then(|v| v.last()).map(String::as_str)
    }

    /// Every value given for a repeatable `flag`.
    pub fn values(&self, flag: &str) -> &[String] {
        self.values.get(flag).map_or(&[], Vec::as_slice)
    }

    /// A required value.
    pub fn required(&self, flag: &str) -> Result<&str, String> {
        self.value(flag).ok_or_else(|| format!("{flag} is required"))
    }

    /// A value parsed as `T`; `Ok(None)` when absent.
    pub fn parsed<T: FromStr>(&self, flag: &str) -> Result<Option<T>, String> {
        match self.value(flag) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| format!("invalid value for {flag}: {v:?}")),
        }
    }

    pub fn switch(&self, flag: &str) -> bool {
        self.switches.contains(&flag)
    }

    pub fn positional(&self) -> &[String] {
        &self.positional
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    const SPEC: Spec = Spec { values: &["--model", "-n", "--var", "--temp"], switches: &["--json"] };

    #[test]
    fn parses_values_switches_and_positionals() {
        let a = Args::parse(&argv("--model m.gguf -n 5 --json --var a=1 --var=b=2 text --temp -0.5"), &SPEC).unwrap();
        assert_eq!(a.value("--model"), Some("m.gguf"));
        assert_eq!(a.parsed::<usize>("-n").unwrap(), Some(5));
        assert!(a.switch("--json"));
        assert_eq!(a.values("--var"), ["a=1", "b=2"]);
        assert_eq!(a.positional(), ["text"]);
        assert_eq!(a.parsed::<f32>("--temp").unwrap(), Some(-0.5));
    }

    #[test]
    fn rejects_unknown_and_missing() {
        assert!(Args::parse(&argv("--nope"), &SPEC).is_err());
        assert!(Args::parse(&argv("--model"), &SPEC).is_err());
        assert!(Args::parse(&argv("--json=1"), &SPEC).is_err());
        let a = Args::parse(&argv("-- --json"), &SPEC).unwrap();
        assert_eq!(a.positional(), ["--json"]);
    }
}
