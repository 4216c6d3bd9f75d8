//! Reserves a virtual range, grows it page by page (create + map + one set_access per growth step),
//! writes and checks a pattern, then releases everything, on the best backend available:
//! Cuda if a GPU is present, else Host (real memory), else Sim. Then runs the expandable allocator
//! on the same backend: allocations of several sizes, data written through them, a free and a
//! reuse, `empty_cache`. Prints what it did and what it cost.
//!
//! Usage: `cargo run --release --example grow_and_release [best|cuda|host|sim]`

use std::process::ExitCode;
use std::time::Instant;

use vmm_alloc::backend::{Access, Backend, Capabilities, PhysHandle};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::units::human_bytes;
use vmm_alloc::{
    AllocError, Allocator, BackendError, ExpandableAllocator, HostBackend, SimBackend, StreamId,
};

/// Growth steps: the segment's mapped size after each one.
const STEPS: [usize; 3] = [64 << 20, 256 << 20, 1 << 30];

fn main() -> ExitCode {
    let choice = std::env::args().nth(1).unwrap_or_else(|| "best".into());
    let result = match choice.as_str() {
        "best" => run_best(),
        "cuda" => run_cuda(),
        "host" => HostBackend::new().and_then(|b| grow_and_release(&b)),
        "sim" => grow_and_release(&SimBackend::new()),
        other => {
            eprintln!("unknown backend {other:?}: expected best, cuda, host or sim");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_best() -> Result<(), BackendError> {
    #[cfg(feature = "cuda")]
    match vmm_alloc::CudaBackend::new(0) {
        Ok(cuda) => return grow_and_release(&cuda),
        Err(e) => println!("cuda: not used ({e})"),
    }
    match HostBackend::new() {
        Ok(host) => grow_and_release(&host),
        Err(e) => {
            println!("host: not used ({e})");
            grow_and_release(&SimBackend::new())
        }
    }
}

fn run_cuda() -> Result<(), BackendError> {
    #[cfg(feature = "cuda")]
    return grow_and_release(&vmm_alloc::CudaBackend::new(0)?);
    #[cfg(not(feature = "cuda"))]
    {
        eprintln!("built without the `cuda` feature");
        Ok(())
    }
}

fn grow_and_release<B: Backend + Clone + 'static>(b: &B) -> Result<(), BackendError> {
    let g = b.granularity();
    let info = b.mem_info()?;
    println!(
        "backend {}: granularity {}, device memory {} free of {}",
        b.name(),
        human_bytes(g as u64),
        human_bytes(info.free as u64),
        human_bytes(info.total as u64)
    );
    let reserve_len = STEPS[STEPS.len() - 1];
    let t = Instant::now();
    let va = b.reserve(reserve_len)?;
    println!(
        "reserved {} of address space at {} in {:?}",
        human_bytes(reserve_len as u64),
        va.start,
        t.elapsed()
    );

    let own = [Access::read_write(b.device())];
    let mut handles: Vec<PhysHandle> = Vec::new();
    let mut mapped = 0usize;
    for target in STEPS {
        let before = b.calls();
        let t = Instant::now();
        let run_start = va
            .start
            .checked_add(mapped)
            .expect("inside the reservation");
        let run_len = target - mapped;
        for _ in 0..run_len / g {
            let h = b.create(g)?;
            handles.push(h);
            let at = va
                .start
                .checked_add(mapped)
                .expect("inside the reservation");
            b.map(at, g, h, 0)?;
            mapped += g;
        }
        // One set_access for the whole contiguous run, not one per page.
        b.set_access(run_start, run_len, &own)?;
        let took = t.elapsed();
        let pages = run_len / g;
        println!(
            "grew to {:>9} (+{} pages) in {:>10.3?}: {:>8.2} µs per page (create + map + share of one set_access); calls: {}",
            human_bytes(mapped as u64),
            pages,
            took,
            took.as_secs_f64() * 1e6 / pages as f64,
            b.calls().since(&before)
        );
    }

    if b.capabilities().contains(Capabilities::BYTES) {
        check_pattern(b, va.start, mapped, g)?;
    }

    let before = b.calls();
    let t = Instant::now();
    b.unmap(va.start, mapped)?;
    for h in handles {
        b.release(h)?;
    }
    b.free_reservation(va)?;
    println!(
        "released everything in {:?}: calls: {}",
        t.elapsed(),
        b.calls().since(&before)
    );
    let live = b.live();
    println!("left behind: {live}");
    println!("all calls: {}", b.calls());
    if !live.is_empty() {
        eprintln!("leak: the backend still holds resources");
    }
    if let Err(e) = allocator_demo(b) {
        eprintln!("allocator demo failed: {e}");
    }
    Ok(())
}

/// The expandable allocator on the same backend, end to end.
fn allocator_demo<B: Backend + Clone + 'static>(b: &B) -> Result<(), AllocError> {
    println!("\nexpandable allocator on {}:", b.name());
    let alloc = ExpandableAllocator::new(b.clone(), ExpandableConfig::default())?;
    let s = StreamId::DEFAULT;
    let sizes = [1000usize, 3 << 20, 100 << 20, 5 << 20];
    let mut blocks = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let a = alloc.allocate(size, s)?;
        if b.capabilities().contains(Capabilities::BYTES) {
            b.write(a.ptr(), &[i as u8 + 1; 64])?;
        }
        println!(
            "  allocate {:>10} -> {} (usable {})",
            human_bytes(size as u64),
            a.ptr(),
            human_bytes(a.size() as u64)
        );
        blocks.push(a);
    }
    let freed = blocks.remove(1);
    let at = freed.ptr();
    alloc.deallocate(freed)?;
    let again = alloc.allocate(2 << 20, s)?;
    println!(
        "  freed the 3 MiB block at {at}; a 2 MiB request reuses {}",
        again.ptr()
    );
    if b.capabilities().contains(Capabilities::BYTES) {
        for (a, tag) in blocks.iter().zip([1u8, 3, 4]) {
            let mut out = [0u8; 64];
            b.read(a.ptr(), &mut out)?;
            assert_eq!(out, [tag; 64], "data of a live allocation changed");
        }
        println!("  the other allocations' data is intact");
    }
    blocks.push(again);
    let st = alloc.stats();
    println!(
        "  allocated {} in {} blocks, reserved {} (mapped pages), {} segments; calls: {}",
        human_bytes(st.allocated_bytes.all.current),
        st.allocation.all.current,
        human_bytes(st.reserved_bytes.all.current),
        st.segment.all.current,
        st.calls
    );
    for a in blocks {
        alloc.deallocate(a)?;
    }
    alloc.empty_cache()?;
    println!(
        "  after freeing everything and empty_cache: reserved {}, backend holds: {}",
        human_bytes(alloc.stats().reserved_bytes.all.current),
        b.live()
    );
    Ok(())
}

/// Writes a distinct 8-byte stamp at the start of every page, then reads them all back.
fn check_pattern<B: Backend>(
    b: &B,
    start: vmm_alloc::DevAddr,
    len: usize,
    g: usize,
) -> Result<(), BackendError> {
    let t = Instant::now();
    let pages = len / g;
    for page in 0..pages {
        let at = start.checked_add(page * g).expect("inside the mapping");
        b.write(at, &(page as u64 ^ 0xA5A5_5A5A).to_le_bytes())?;
    }
    let mut bad = 0;
    for page in 0..pages {
        let at = start.checked_add(page * g).expect("inside the mapping");
        let mut out = [0u8; 8];
        b.read(at, &mut out)?;
        if u64::from_le_bytes(out) != page as u64 ^ 0xA5A5_5A5A {
            bad += 1;
        }
    }
    println!(
        "wrote and read back a stamp in each of {pages} pages in {:?}: {} wrong",
        t.elapsed(),
        bad
    );
    Ok(())
}
