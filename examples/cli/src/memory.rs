//! How a command loads its model: `--memory-budget SIZE` (see
//! `pocket_core::model::MemoryPlan`) and `--backend cpu|gpu`, shared by
//! `run`, `chat`, `bench`, `logits` and `perplexity`.

use pocket_core::model::{BackendKind, LoadOptions, Model};

/// The memory budget and backend of a command that loads a model.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Budget {
    /// Keep the model and one session within SIZE bytes (6G, 5500M, or bytes):
    /// the weights every token reads stay in memory, routed experts come from
    /// a cache sized to the rest; 0 = no budget (map the file)
    #[arg(long = "memory-budget", value_name = "SIZE", default_value = "0", value_parser = parse_size)]
    pub bytes: u64,
    /// Device for the passes: cpu, gpu (matrix products on the GPU), or auto (= cpu for now)
    #[arg(long, value_name = "DEVICE", default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendKind,
}

impl Budget {
    /// Load `path` under this budget on this backend; errors name the file.
    pub fn load(&self, path: &str) -> Result<Model, String> {
        self.load_with_template(path, None)
    }

    /// [`load`](Self::load) with a chat template used instead of the file's.
    pub fn load_with_template(&self, path: &str, chat_template: Option<String>) -> Result<Model, String> {
        let opts = LoadOptions { memory_budget: self.bytes, backend: self.backend, chat_template };
        Model::load_with(path, &opts).map_err(|e| format!("{path}: {e}"))
    }
}

fn parse_backend(s: &str) -> Result<BackendKind, String> {
    BackendKind::from_name(s).ok_or_else(|| format!("'{s}' is not a backend (cpu, gpu or auto)"))
}

/// `6G`, `5500M`, `512K`, `1T` (powers of 1024, an optional `i`/`B`/`iB`
/// after the letter), or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("'{s}' is not a size (use e.g. 6G, 5500M or a number of bytes)");
    let digits = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches('B').trim_end_matches('I') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    if shift == 0 {
        return num.parse::<u64>().map_err(|_| bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_in_bytes_and_binary_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("123456"), Ok(123_456));
        assert_eq!(parse_size("6G"), Ok(6 << 30));
        assert_eq!(parse_size("6GiB"), Ok(6 << 30));
        assert_eq!(parse_size("5500M"), Ok(5500 << 20));
        assert_eq!(parse_size("5.5g"), Ok(5632 << 20));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        for bad in ["", "G", "6X", "-1G", "1.5", "6 GB extra"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
