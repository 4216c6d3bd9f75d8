//! GPU benchmarks (issue 7, benchmark 6): benchmarks 1–4 on the Cuda backend, against the
//! allocation calls a Rust user would otherwise make, and the raw driver loop as the floor for
//! growth. Without a CUDA driver or device (or built without the `cuda` feature) it prints one
//! line, `gpu benches SKIPPED: <reason>`, and exits successfully, so `cargo bench` still runs
//! every other bench.
//!
//! Groups (device 0, one process, everything on `CudaBackend`):
//! * `gpu_hot_path/<allocator>/<size>/live<count>`: a cached allocate + deallocate pair, as
//!   `hot_path.rs` (same sizes, same fragmented background, live 0 and 1,000), for expandable,
//!   classic and pytorch-expandable; and the baselines at the same sizes (`live0`: they hold
//!   nothing else): `cudarc-alloc` (`CudaStream::alloc` on the default stream and drop: cudarc's
//!   `cuMemAllocAsync` + `cuMemFreeAsync`, with its default event tracking), `cuMemAllocAsync`
//!   (the same driver calls without cudarc's events) and `cuMemAlloc` (`cuMemAlloc` +
//!   `cuMemFree`); and `device-buffer`, our `DeviceBuffer<u8>` allocate + drop on the expandable
//!   allocator, what a cudarc user writes instead of `cudarc-alloc`. The stream-ordered baselines
//!   synchronize after each batch, untimed.
//! * `gpu_threads/<workload>/<threads>/<allocator>`: `threads.rs`'s loops (`ring`, `same_size`,
//!   `varied`) on 1 and 2 threads, each on a registered cudarc stream of its own, every allocator
//!   of `bench_threads::contenders` on the Cuda backend; the side output's `threads` holds two
//!   threads' throughput over one's for each. Run last, after the JSON of the others is written:
//!   a run cut short there keeps them.
//! * `gpu_growth/<N>GiB/<case>`: `growth.rs`'s cases on Cuda (1 GiB and 8 GiB; a target with less
//!   than target + 1 GiB free is skipped with a line saying so), the raw loop being
//!   cuMemCreate + cuMemMap + cuMemSetAccess per page through the backend, no allocator.
//! * churn and replay run expandable, classic, pytorch-expandable and `expandable-2MiB-pages`
//!   (ours with `large_page_mb:2`: what 2 MiB pages cost on a device).
//! * `gpu_churn/<allocator>/max<M>MiB/ops10000`: `churn.rs`'s RMM shape on a 16 GiB budget
//!   (`per_process_memory_fraction` = 16 GiB / device memory); 10,000 operations only. And
//!   `gpu_churn/<allocator>/inference-server-4-s1/budget7GiB`: the generated four-stream
//!   inference server on a 7 GiB budget, pressure on several streams and segments.
//! * `gpu_replay/<allocator>/<trace>`: `replay.rs`'s traces on the whole device, throughput in
//!   events (one element per event).
//!
//! `vmm_replay::replay::replay` drives a Sim only, so churn and replay here use `cuda::replay_on`, the
//! same loop on any allocator: a fresh allocator per run (building and dropping it are timed, as on
//! Sim), `held_bytes()` read after every event for the peak (as on Sim), OOMs counted and skipped.
//! Each trace stream is a cudarc stream registered with the backend (stream 0 the legacy one).
//! What each run needed (OOMs, peaks), the device and the skipped parts go to
//! `<target>/bench-extra/gpu.json`; the skip reason alone when skipped. Each churn and replay run
//! is also replayed untimed on a Sim of the same device and budget (`sim-check` lines, `sim` in
//! the JSON): the expandable policies' OOMs and peaks must be the same on both.

// The bench helpers shared with the library's benches.
use vmm_dev_support::bench_extra::{self as extra, Json};

/// Prints the skip line and records it for the report.
fn skip(why: &str) {
    println!("gpu benches SKIPPED: {why}");
    extra::write("gpu", &Json::obj([("skipped", why.into())]));
}

#[cfg(not(feature = "cuda"))]
fn main() {
    skip("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
fn main() {
    let backend = match cuda::open() {
        Ok(b) => b,
        Err(why) => return skip(&why),
    };
    let mut c = criterion::Criterion::default().configure_from_args();
    cuda::run(&mut c, &backend);
    c.final_summary();
}

#[cfg(feature = "cuda")]
use vmm_dev_support::{
    bench_growth as growth, bench_hot as hot, bench_threads as threads, shared_trace,
};

#[cfg(feature = "cuda")]
mod cuda {
    use std::collections::HashMap;
    use std::hint::black_box;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use criterion::measurement::WallTime;
    use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
    use cudarc::driver::{result, sys, CudaContext, CudaStream};
    use vmm_alloc::backend::{Backend, SimConfig};
    use vmm_alloc::config::{AllocConf, ExpandableConfig};
    use vmm_alloc::{
        AllocError, Allocation, Allocator, ClassicAllocator, CudaBackend, CudaMemory,
        ExpandableAllocator, SimBackend, StreamId,
    };
    use vmm_replay::advise::SMALLEST_SETTING;
    use vmm_replay::replay::Policy;
    use vmm_replay::{workloads, Event, Trace};

    use crate::extra::{self, Json, Needed};
    use crate::growth::{GIB, MIB, TARGETS};
    use crate::{growth, hot, shared_trace, threads};

    /// Live counts of the hot path (100,000 is left to the Sim bench: the pair never reaches the
    /// driver, so the bookkeeping's scaling is measured there).
    const LIVE: [usize; 2] = [0, 1_000];
    /// The churn device of `churn.rs`.
    const CHURN_BUDGET: usize = 16 * GIB;
    /// `churn.rs`'s seed.
    const SEED: u64 = 1;
    /// An allocator the churn and replay groups run: a policy, settings on top of the trace's,
    /// and the name its figures carry.
    #[derive(Clone, Copy)]
    struct Contender {
        policy: Policy,
        settings: Option<&'static str>,
        name: &'static str,
    }

    /// The three allocators, and ours with 2 MiB pages (`large_page_mb:2`, the smallest footprint:
    /// POLICY.md, "The other side of the conflict"), whose driver time on a device is what decides
    /// whether it could be the default.
    const CONTENDERS: [Contender; 4] = [
        Contender {
            policy: Policy::Expandable,
            settings: None,
            name: "expandable",
        },
        Contender {
            policy: Policy::Classic,
            settings: None,
            name: "classic",
        },
        Contender {
            policy: Policy::PytorchExpandable,
            settings: None,
            name: "pytorch-expandable",
        },
        Contender {
            policy: Policy::Expandable,
            settings: Some(SMALLEST_SETTING),
            name: "expandable-2MiB-pages",
        },
    ];

    /// Device 0, or why not.
    pub fn open() -> Result<CudaBackend, String> {
        if !CudaBackend::driver_present() {
            return Err("no CUDA driver on this machine (libcuda not found)".into());
        }
        CudaBackend::new(0).map_err(|e| e.to_string())
    }

    pub fn run(c: &mut Criterion, backend: &CudaBackend) {
        let ctx = backend.context().clone();
        let device = ctx.name().unwrap_or_else(|e| format!("unknown ({e})"));
        let total = backend.mem_info().expect("cuMemGetInfo").total;
        println!(
            "gpu benches on {device}, {:.1} GiB",
            total as f64 / GIB as f64
        );
        let head = || {
            [
                ("skipped", Json::Null),
                ("device", device.clone().into()),
                ("total_bytes", total.into()),
            ]
        };
        // Written now too, so a run cut short still names the device.
        extra::write("gpu", &Json::obj(head()));
        let hot = hot_path(c, backend, &ctx);
        let growth = growth_all(c, backend);
        let churn = churn(c, backend, total);
        let replay = replay(c, backend, total);
        let mut fields = Vec::from(head());
        fields.extend([
            ("hot_path", hot),
            ("growth", growth),
            ("churn", churn),
            ("replay", replay),
        ]);
        // The threads group last, the rest written before it: a run that the validation's bench
        // timeout cuts there keeps every figure the Sim check needs.
        extra::write("gpu", &Json::obj(fields.clone()));
        fields.push(("threads", threads_all(c, backend)));
        extra::write("gpu", &Json::obj(fields));
    }

    fn hot_path(c: &mut Criterion, backend: &CudaBackend, ctx: &Arc<CudaContext>) -> Json {
        let mut group = c.benchmark_group("gpu_hot_path");
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        let mut notes = Vec::new();
        for live in LIVE {
            notes.extend(hot::measure_all(&mut group, live, || backend.clone()));
        }
        baselines(&mut group, ctx);
        device_buffer(&mut group, backend);
        group.finish();
        hot::driver_notes(notes)
    }

    /// `threads.rs`'s groups on Cuda: 1 and 2 threads, each on a cudarc stream of its own
    /// registered with the backend, against one shared allocator (goal 4 of issue 19: 2 threads
    /// ≥ 1.5 × one). The side output holds each allocator's two-over-one ratio per workload,
    /// timed alternately outside criterion (`bench_threads::scaling`, 5 rounds).
    fn threads_all(c: &mut Criterion, backend: &CudaBackend) -> Json {
        let stream = || {
            let cu = backend.context().new_stream().expect("cuStreamCreate");
            backend.register_stream(&cu).expect("register_stream")
        };
        let streams = [stream(), stream()];
        let shared = backend.clone();
        let contenders = threads::contenders(move || shared.clone());
        let mut rows = Vec::new();
        for shapes in threads::Shapes::ALL {
            threads::measure(
                c,
                shapes,
                &contenders,
                streams,
                |n| format!("gpu_threads/{}/{n}", shapes.short()),
                |g| {
                    g.sample_size(10)
                        .warm_up_time(Duration::from_millis(300))
                        .measurement_time(Duration::from_secs(1));
                },
            );
            rows.extend(threads::scaling(shapes, &contenders, streams, 5));
        }
        Json::Arr(rows)
    }

    /// The allocation calls a Rust user would otherwise make, one pair per iteration.
    fn baselines(group: &mut BenchmarkGroup<'_, WallTime>, ctx: &Arc<CudaContext>) {
        ctx.bind_to_thread().expect("bind the context");
        let stream = ctx.default_stream();
        let pools = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            .unwrap_or(0)
            > 0;
        if !pools {
            println!("gpu_hot_path: cuMemAllocAsync SKIPPED (the device has no memory pools)");
        }
        for (size, label) in hot::SIZES {
            let case = hot::case(label, 0);
            group.bench_function(BenchmarkId::new("cudarc-alloc", &case), |b| {
                b.iter_custom(|iters| {
                    stream_ordered(&stream, iters, || {
                        // SAFETY: `alloc` leaves the memory uninitialized; it is never read,
                        // only freed when the slice drops.
                        let slice = unsafe { stream.alloc::<u8>(black_box(size)) }
                            .expect("CudaStream::alloc");
                        drop(black_box(slice));
                    })
                })
            });
            if pools {
                let raw = stream.cu_stream();
                group.bench_function(BenchmarkId::new("cuMemAllocAsync", &case), |b| {
                    b.iter_custom(|iters| {
                        stream_ordered(&stream, iters, || {
                            // SAFETY: `raw` is a live stream of the bound context; the pointer
                            // is never used and is freed once, on the stream it came from.
                            unsafe {
                                let p = result::malloc_async(raw, black_box(size))
                                    .expect("cuMemAllocAsync");
                                result::free_async(black_box(p), raw).expect("cuMemFreeAsync");
                            }
                        })
                    })
                });
            }
            group.bench_function(BenchmarkId::new("cuMemAlloc", &case), |b| {
                b.iter(|| {
                    // SAFETY: the pointer comes from `cuMemAlloc`, is never used and is freed
                    // once.
                    unsafe {
                        let p = result::malloc_sync(black_box(size)).expect("cuMemAlloc");
                        result::free_sync(black_box(p)).expect("cuMemFree");
                    }
                })
            });
        }
        ctx.check_err()
            .expect("cudarc recorded an error while freeing");
    }

    /// Runs `pair` `iters` times and returns the time; the stream is synchronized after, untimed,
    /// so the batch's frees have completed before the next one.
    /// `DeviceBuffer<u8>` allocate + drop on the expandable allocator (`device-buffer`), the pair
    /// a cudarc user makes instead of `cudarc-alloc`: the allocator's pair plus cudarc's events
    /// and the stream-ordered free (Note [Stream-ordered drop]).
    fn device_buffer(group: &mut BenchmarkGroup<'_, WallTime>, backend: &CudaBackend) {
        let memory = CudaMemory::new(backend.clone(), |b| {
            ExpandableAllocator::new(b, ExpandableConfig::default())
        })
        .expect("CudaMemory");
        let stream = memory.context().default_stream();
        for (size, label) in hot::SIZES {
            let case = hot::case(label, 0);
            drop(memory.alloc::<u8>(size, &stream).expect("warm the cache"));
            group.bench_function(BenchmarkId::new("device-buffer", &case), |b| {
                b.iter_custom(|iters| {
                    stream_ordered(&stream, iters, || {
                        let buf = memory
                            .alloc::<u8>(black_box(size), &stream)
                            .expect("DeviceBuffer");
                        drop(black_box(buf));
                    })
                })
            });
        }
    }

    fn stream_ordered(stream: &CudaStream, iters: u64, pair: impl Fn()) -> Duration {
        let t = Instant::now();
        for _ in 0..iters {
            pair();
        }
        let took = t.elapsed();
        stream.synchronize().expect("synchronize");
        took
    }

    fn growth_all(c: &mut Criterion, backend: &CudaBackend) -> Json {
        let new = || CudaBackend::new(0).expect("cuda backend");
        let mut counted = Vec::new();
        let mut skipped = Vec::new();
        for target in TARGETS {
            let free = backend.mem_info().expect("cuMemGetInfo").free;
            if free < target + GIB {
                let why = format!(
                    "growth to {} GiB SKIPPED: {:.1} GiB free",
                    target / GIB,
                    free as f64 / GIB as f64
                );
                println!("gpu_{why}");
                skipped.push(Json::from(why));
                continue;
            }
            counted.push(growth::call_counts(target, &new));
            growth::bench_target(c, "gpu_growth", target, &new);
        }
        Json::obj([
            ("targets", Json::Arr(counted)),
            ("skipped", Json::Arr(skipped)),
        ])
    }

    /// One allocator of `who` on `backend`, holding at most `fraction` of the device, with the
    /// trace's `PYTORCH_CUDA_ALLOC_CONF` applied as `vmm_replay::replay::replay` does.
    fn make<B: Backend + Clone + 'static>(
        who: Contender,
        backend: &B,
        conf: Option<&str>,
        fraction: f64,
    ) -> Box<dyn Allocator> {
        match who.policy.config(conf) {
            Some(config) => {
                let config = match who.settings {
                    Some(settings) => config.with_settings(settings).expect("own settings"),
                    None => config,
                };
                let config = ExpandableConfig {
                    memory_fraction: config.memory_fraction.min(fraction),
                    ..config
                };
                Box::new(ExpandableAllocator::new(backend.clone(), config).expect("expandable"))
            }
            None => {
                let base = Policy::alloc_conf(conf);
                let conf = AllocConf {
                    per_process_memory_fraction: base.per_process_memory_fraction.min(fraction),
                    ..base
                };
                Box::new(ClassicAllocator::new(backend.clone(), conf).expect("classic"))
            }
        }
    }

    /// Replays `trace` through a fresh allocator of `who`, as `vmm_replay::replay::replay` does on
    /// Sim: initial blocks, then the events; an allocation that fails out of memory is counted
    /// and its free skipped; the program's `empty_cache()` calls are replayed; `held_bytes()` is
    /// read after every event for the peak reserved (mapped pages plus cached handles).
    fn replay_on<B: Backend + Clone + 'static>(
        trace: &Trace,
        who: Contender,
        backend: &B,
        streams: &HashMap<u64, StreamId>,
        fraction: f64,
    ) -> Needed {
        let alloc = make(who, backend, trace.alloc_conf.as_deref(), fraction);
        let alloc = &*alloc;
        let mut live: HashMap<u64, (Allocation, u64)> = HashMap::new();
        let mut n = Needed {
            events: 0,
            ooms: 0,
            peak_live: 0,
            peak_reserved: 0,
        };
        let mut live_bytes = 0;
        let initial = trace.initial.iter().map(|b| Event::Alloc {
            id: b.id,
            size: b.size,
            stream: b.stream,
        });
        for e in initial.chain(trace.events.iter().copied()) {
            match e {
                Event::Alloc { id, size, stream } => {
                    let bytes = usize::try_from(size).unwrap_or(usize::MAX);
                    match alloc.allocate(bytes, streams[&stream]) {
                        Ok(a) => {
                            live_bytes += size;
                            n.peak_live = n.peak_live.max(live_bytes);
                            if let Some((old, old_size)) = live.insert(id, (a, size)) {
                                live_bytes -= old_size;
                                alloc.deallocate(old).expect("deallocate");
                            }
                        }
                        Err(e)
                            if e.is_out_of_memory() || matches!(e, AllocError::TooLarge { .. }) =>
                        {
                            n.ooms += 1
                        }
                        Err(e) => panic!("allocate: {e}"),
                    }
                }
                Event::Free { id } => {
                    if let Some((a, size)) = live.remove(&id) {
                        live_bytes -= size;
                        alloc.deallocate(a).expect("deallocate");
                    }
                }
                Event::EmptyCache => alloc.empty_cache().expect("empty_cache"),
                // A request the traced program failed: served and freed at once, as the replay.
                Event::FailedAlloc { size, stream } => {
                    let bytes = usize::try_from(size).unwrap_or(usize::MAX);
                    match alloc.allocate(bytes, streams[&stream]) {
                        Ok(a) => alloc.deallocate(a).expect("deallocate"),
                        Err(_) => n.ooms += 1,
                    }
                }
            }
            n.peak_reserved = n.peak_reserved.max(alloc.held_bytes());
            n.events += 1;
        }
        // What is still live stays so, as on Sim: dropping the allocator gives everything back.
        drop(live);
        n
    }

    /// The run just measured, replayed on a Sim of this device: its memory rounded down to the
    /// granularity, a budget of `budget` bytes as on the device (the same memory fraction formula),
    /// each trace stream a Sim stream. Prints a `sim-check` line saying whether OOMs and peaks agree
    /// and returns the Sim's figures. The expandable policies depend on no address, so they must
    /// agree (a difference is a Sim or backend defect); classic's best fit breaks ties between equal
    /// free blocks by address, and the driver hands out reservations in another order than Sim,
    /// so its figures may differ a little (2026-11-27 on an H200: 2 segments of 821).
    fn sim_check(
        trace: &Trace,
        who: Contender,
        total: usize,
        budget: f64,
        gpu: &Needed,
        case: &str,
    ) -> Json {
        let capacity = total / (2 * MIB) * (2 * MIB);
        let fraction = (budget / capacity as f64).min(1.0);
        let sim = match SimBackend::with_config(SimConfig {
            capacity,
            ..SimConfig::default()
        }) {
            Ok(sim) => sim,
            Err(e) => return Json::obj([("error", e.to_string().into())]),
        };
        let streams = stream_ids(trace, StreamId::sim);
        let n = replay_on(trace, who, &sim, &streams, fraction);
        let agrees = n.ooms == gpu.ooms && n.peak_reserved == gpu.peak_reserved;
        println!(
            "sim-check {} {case}: GPU {} OOMs, peak reserved {} B; Sim {} OOMs, {} B: {}",
            who.name,
            gpu.ooms,
            gpu.peak_reserved,
            n.ooms,
            n.peak_reserved,
            if agrees { "same" } else { "DIFFERENT" }
        );
        Json::obj([
            ("ooms", n.ooms.into()),
            ("peak_reserved_bytes", n.peak_reserved.into()),
            ("agrees", Json::Bool(agrees)),
        ])
    }

    /// `record` (a [`Needed::report`] object) with the Sim's figures under `sim`.
    fn with_sim(record: Json, sim: Json) -> Json {
        match record {
            Json::Obj(mut fields) => {
                fields.push(("sim".into(), sim));
                Json::Obj(fields)
            }
            other => other,
        }
    }

    /// A registered cudarc stream for every stream the trace names (0: the legacy stream).
    fn streams_of(trace: &Trace, backend: &CudaBackend) -> HashMap<u64, StreamId> {
        stream_ids(trace, |_| {
            let cu = backend.context().new_stream().expect("cuStreamCreate");
            backend.register_stream(&cu).expect("register_stream")
        })
    }

    /// A stream id for every stream the trace names, made once each by `make` (0 is the
    /// legacy stream on every backend).
    fn stream_ids(trace: &Trace, mut make: impl FnMut(u64) -> StreamId) -> HashMap<u64, StreamId> {
        let mut streams = HashMap::from([(0, StreamId::DEFAULT)]);
        let named = trace.initial.iter().map(|b| b.stream);
        let named = named.chain(trace.events.iter().filter_map(|e| match e {
            Event::Alloc { stream, .. } | Event::FailedAlloc { stream, .. } => Some(*stream),
            _ => None,
        }));
        for s in named {
            streams.entry(s).or_insert_with(|| make(s));
        }
        streams
    }

    fn churn(c: &mut Criterion, backend: &CudaBackend, total: usize) -> Json {
        let fraction = (CHURN_BUDGET as f64 / total as f64).min(1.0);
        let mut group = c.benchmark_group("gpu_churn");
        // A run is tens of milliseconds to seconds on a device: flat sampling, ten runs.
        group
            .sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        let mut runs = Vec::new();
        let ops = 10_000;
        let mut cases: Vec<(Trace, String, usize)> = [1, 64, 256]
            .map(|max_mib| {
                let trace = workloads::rmm_random(SEED, max_mib * MIB as u64, ops);
                (trace, format!("max{max_mib}MiB/ops{ops}"), CHURN_BUDGET)
            })
            .into();
        // Four streams under pressure, on a budget each policy fits in (on Sim, 2026-11-27:
        // 6,608 to 7,124 MiB): the Sim check then covers several segments and streams, whose
        // order on the device (reservation addresses, stream handles) is not the Sim's.
        let server = workloads::inference_server(1, 4);
        cases.push((server, "inference-server-4-s1/budget7GiB".into(), 7 * GIB));
        for (trace, case, budget) in &cases {
            let fraction = (*budget as f64 / total as f64).min(1.0);
            let streams = streams_of(trace, backend);
            for who in CONTENDERS {
                let run = || replay_on(trace, who, backend, &streams, fraction);
                let gpu = run();
                let sim = sim_check(trace, who, total, *budget as f64, &gpu, case);
                runs.push(with_sim(gpu.report("gpu_churn", who.name, case), sim));
                group.bench_function(BenchmarkId::new(who.name, case), |b| b.iter(&run));
            }
        }
        group.finish();
        Json::obj([
            ("capacity_bytes", ((total as f64 * fraction) as u64).into()),
            ("runs", Json::Arr(runs)),
        ])
    }

    fn replay(c: &mut Criterion, backend: &CudaBackend, total: usize) -> Json {
        let mut traces = vec![workloads::transformer_training(1)];
        let mut skipped = Json::Null;
        match shared_trace::largest() {
            Ok(t) => traces.push(t),
            Err(why) => {
                println!("gpu_replay: SKIPPED the shared trace ({why})");
                skipped = why.into();
            }
        }
        let mut group = c.benchmark_group("gpu_replay");
        group
            .sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        let mut runs = Vec::new();
        for trace in &traces {
            let events = (trace.initial.len() + trace.events.len()) as u64;
            let streams = streams_of(trace, backend);
            group.throughput(Throughput::Elements(events));
            for who in CONTENDERS {
                let run = || replay_on(trace, who, backend, &streams, 1.0);
                let gpu = run();
                let sim = sim_check(trace, who, total, total as f64, &gpu, &trace.name);
                runs.push(with_sim(
                    gpu.report("gpu_replay", who.name, &trace.name),
                    sim,
                ));
                group.bench_function(BenchmarkId::new(who.name, &trace.name), |b| b.iter(&run));
            }
        }
        group.finish();
        Json::obj([("runs", Json::Arr(runs)), ("shared_trace_skipped", skipped)])
    }
}
