//! A cudarc program on our allocator: upload, memset, a kernel, a view, download, check.
//!
//! `cargo run --release --example cudarc_buffer`. Every line it prints is deterministic (no
//! address, no timing), so `scripts/gpu-validate.sh` compares it with
//! `examples/cudarc_buffer.expected`. Without a GPU it says so and exits 0.

use std::process::ExitCode;

use vmm_alloc::cudarc::driver::{DeviceSlice, LaunchConfig, PushKernelArg};
use vmm_alloc::cudarc::nvrtc::Ptx;
use vmm_alloc::{Allocator, CudaBackend, CudaMemory};

/// `add_one(float *data, unsigned n)`, hand-written PTX: loading it needs no NVRTC.
const ADD_ONE_PTX: &str = include_str!("../tests/data/add_one.ptx");
const N: usize = 1 << 20;

fn main() -> ExitCode {
    if !CudaBackend::driver_present() {
        println!("no GPU: libcuda was not found; nothing to run");
        return ExitCode::SUCCESS;
    }
    let memory = match CudaMemory::expandable(0) {
        Ok(m) => m,
        Err(e) => {
            println!("no GPU: {e}");
            return ExitCode::SUCCESS;
        }
    };
    match run(&memory) {
        Ok(()) => {
            println!("cudarc example: OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("cudarc example: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(memory: &std::sync::Arc<CudaMemory>) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = memory.context();
    let stream = ctx.new_stream()?;
    let host: Vec<f32> = (0..N).map(|i| i as f32).collect();

    let mut data = memory.alloc::<f32>(N, &stream)?;
    stream.memcpy_htod(&host, &mut data)?;
    println!("uploaded {} f32 into a DeviceBuffer", data.len());

    let zeros = memory.alloc_zeros::<f32>(N, &stream)?;
    let back = stream.clone_dtoh(&zeros)?;
    check(
        back.iter().all(|&x| x == 0.0),
        "memset_zeros left non-zero bytes",
    )?;
    println!("memset_zeros: {} zeros", back.len());

    let module = ctx.load_module(Ptx::from_src(ADD_ONE_PTX))?;
    let add_one = module.load_function("add_one")?;
    let n = N as u32;
    let mut launch = stream.launch_builder(&add_one);
    launch.arg(&mut data).arg(&n);
    // SAFETY: add_one takes (float *data, unsigned n), exactly the arguments pushed, and touches
    // only data[0..n), which the buffer holds.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
    let out = stream.clone_dtoh(&data)?;
    let wrong = out
        .iter()
        .zip(&host)
        .filter(|(o, h)| **o != **h + 1.0)
        .count();
    check(wrong == 0, &format!("{wrong} elements wrong after add_one"))?;
    println!("kernel add_one: all {} elements correct", out.len());

    let view = data.slice(10..20).ok_or("slice 10..20 out of bounds")?;
    let part = stream.clone_dtoh(&view)?;
    check(
        part == (10..20).map(|i| i as f32 + 1.0).collect::<Vec<_>>(),
        "view read the wrong elements",
    )?;
    println!("view [10..20): {:?}", part);
    check(
        data.slice(0..N + 1).is_none(),
        "an out-of-bounds view was made",
    )?;

    // Used on a second stream, then dropped while that copy may still run: stream-ordered.
    let other = ctx.new_stream()?;
    let mut copy = vec![0f32; N];
    other.memcpy_dtoh(&data, &mut copy)?;
    drop(data);
    drop(zeros);
    other.synchronize()?;
    check(
        copy[N - 1] == N as f32,
        "the copy on the second stream is wrong",
    )?;
    println!("second stream: copy correct after the buffer was dropped");

    stream.synchronize()?;
    let live = memory.stats().allocated_bytes.all.current;
    check(live == 0, &format!("{live} bytes still allocated"))?;
    println!("allocator: 0 bytes allocated after the drops");
    Ok(())
}

fn check(ok: bool, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    if ok {
        Ok(())
    } else {
        Err(what.into())
    }
}
