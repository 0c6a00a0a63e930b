//! `pocket split` and `pocket merge`: a model cut into shards and put back
//! together, byte for byte as `llama-gguf-split --split` and `--merge` do
//! (see `pocket_core::gguf::split`).

use std::path::Path;

use pocket_core::gguf::split::{self, parse_size, SplitLimit, SplitOptions};
use pocket_core::gguf::GgufFile;

/// Split a GGUF model into shards OUT_PREFIX-0000k-of-0000N.gguf (as llama-gguf-split --split)
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("limit").required(true).args(["max_size", "max_tensors"])))]
pub struct SplitArgs {
    /// At most SIZE of tensor data a shard: a whole number and M (10^6 bytes) or G (10^9 bytes), e.g. 100M, 2G
    #[arg(long, value_name = "SIZE")]
    max_size: Option<String>,
    /// At most N tensors a shard
    #[arg(long, value_name = "N")]
    max_tensors: Option<usize>,
    /// Put no tensor in the first shard (the metadata only)
    #[arg(long)]
    no_tensor_first_split: bool,
    /// The GGUF model to split
    #[arg(value_name = "IN")]
    input: String,
    /// The shards' path without its -0000k-of-0000N.gguf ending
    #[arg(value_name = "OUT_PREFIX")]
    prefix: String,
}

/// Merge a split model into one GGUF file (as llama-gguf-split --merge)
#[derive(clap::Args)]
pub struct MergeArgs {
    /// The first shard (PREFIX-00001-of-0000N.gguf); the others are read from beside it
    #[arg(value_name = "FIRST_SHARD")]
    first: String,
    /// The merged file to write (it must not exist)
    #[arg(value_name = "OUT")]
    output: String,
}

pub fn split(a: SplitArgs) -> Result<(), String> {
    let limit = match (&a.max_size, a.max_tensors) {
        (Some(size), _) => SplitLimit::Bytes(parse_size(size).map_err(|e| format!("--max-size: {e}"))?),
        (None, Some(0)) => return Err("--max-tensors must be at least 1".into()),
        (None, Some(n)) => SplitLimit::Tensors(n),
        (None, None) => return Err("--max-size or --max-tensors is required".into()),
    };
    let opts = SplitOptions { limit, no_tensor_first_split: a.no_tensor_first_split };
    let input = GgufFile::open(&a.input).map_err(|e| format!("{}: {e}", a.input))?;
    let paths = split::split(&input, &a.prefix, &opts, &mut |path, n| {
        eprintln!("wrote {} ({n} tensors)", path.display());
    })
    .map_err(|e| format!("{}: {e}", a.input))?;
    outln!("{}: {} tensors in {} shards", a.input, input.tensors().len(), paths.len());
    Ok(())
}

pub fn merge(a: MergeArgs) -> Result<(), String> {
    split::merge(Path::new(&a.first), Path::new(&a.output)).map_err(|e| format!("{}: {e}", a.first))?;
    outln!("merged {} into {}", a.first, a.output);
    Ok(())
}
