//! `pocket gpu-info [--json]`: the GPU adapter Pocket would use, its
//! features, the limits that shape the kernels, and the form of the kernels
//! it runs (`kernels`: `f16+subgroups` ... `portable`; a model's too, since
//! both honour `POCKET_GPU_KERNELS=portable`).

use pocket_core::gpu::{AdapterInfo, Gpu, GpuOptions};
use pocket_core::model::HostBlock;
use serde_json::{json, Map, Value};

/// The GPU adapter, its features and limits (fails when there is none)
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    let gpu = Gpu::new(&GpuOptions::from_env()).map_err(|e| e.to_string())?;
    let info = gpu.info();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&to_json(info)).map_err(|e| e.to_string())?);
        return Ok(());
    }
    outln!("adapter      {} ({}, {})", info.name, info.device_type, info.backend);
    outln!("driver       {} {}", info.driver, info.driver_info);
    outln!("vendor       {:#06x}, device {:#06x}", info.vendor, info.device);
    outln!("shader-f16   {}", yes_no(info.shader_f16));
    outln!("subgroups    {} (size {}..{})", yes_no(info.subgroups), info.subgroup_min_size, info.subgroup_max_size);
    outln!("kernels      {}", info.kernels.name());
    outln!("on the CPU   {} (blocks without a device path)", host_blocks().join(" "));
    outln!("features     {}", if info.features.is_empty() { "-".into() } else { info.features.join(" ") });
    outln!("limits");
    for (name, value) in info.limits.entries() {
        outln!("  {name:<40} {value}");
    }
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn to_json(info: &AdapterInfo) -> Value {
    let limits: Map<String, Value> = info.limits.entries().iter().map(|&(k, v)| (k.to_string(), json!(v))).collect();
    json!({
        "name": info.name,
        "driver": info.driver,
        "driver_info": info.driver_info,
        "backend": info.backend,
        "device_type": info.device_type,
        "vendor": info.vendor,
        "device": info.device,
        "shader_f16": info.shader_f16,
        "subgroups": info.subgroups,
        "subgroup_min_size": info.subgroup_min_size,
        "subgroup_max_size": info.subgroup_max_size,
        "features": info.features,
        "limits": limits,
        "kernels": {"name": info.kernels.name(), "f16": info.kernels.f16, "subgroups": info.kernels.subgroups},
        "host_blocks": host_blocks(),
    })
}

/// The blocks that run on the CPU under the GPU backend, whatever the device.
fn host_blocks() -> Vec<&'static str> {
    HostBlock::ALL.iter().map(|b| b.name()).collect()
}
