// throwaway probe: ceiling of 2-thread scaling on this machine
use std::sync::{Arc, Barrier};
use std::time::Instant;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, SimBackend, StreamId};
const SIZES: [usize; 6] = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 20 << 20];
fn work(a: &dyn Allocator, stream: StreamId, n: usize) {
    let mut ring: Vec<Allocation> = (0..8)
        .map(|i| a.allocate(SIZES[i % 6], stream).unwrap())
        .collect();
    for i in 0..n {
        let old = ring.remove(0);
        a.deallocate(old).unwrap();
        ring.push(a.allocate(SIZES[i % 6], stream).unwrap());
    }
    for b in ring {
        a.deallocate(b).unwrap();
    }
}
fn spin(n: usize) -> u64 {
    let mut x = 1u64;
    for i in 0..n as u64 * 60 {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}
fn main() {
    let n = 2_000_000;
    let mk = || -> Arc<dyn Allocator> {
        Arc::new(ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap())
    };
    for rep in 0..3 {
        for mode in ["shared", "separate", "spin"] {
            for threads in [1usize, 2] {
                let shared = mk();
                let per = n / threads; // same total work
                let bar = Arc::new(Barrier::new(threads + 1));
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let a = if mode == "separate" {
                            mk()
                        } else {
                            shared.clone()
                        };
                        let bar = bar.clone();
                        let mode = mode.to_string();
                        std::thread::spawn(move || {
                            let s = StreamId::sim(t as u64 + 1);
                            work(&*a, s, 100);
                            bar.wait();
                            if mode == "spin" {
                                std::hint::black_box(spin(per));
                            } else {
                                work(&*a, s, per);
                            }
                        })
                    })
                    .collect();
                bar.wait();
                let t0 = Instant::now();
                for h in hs {
                    h.join().unwrap();
                }
                let dt = t0.elapsed();
                println!("rep {rep} {mode:9} threads {threads}: {:.1} ns/pair total-throughput {:.2} Mpairs/s", dt.as_nanos() as f64 / n as f64, n as f64 / dt.as_secs_f64() / 1e6);
            }
        }
    }
}
