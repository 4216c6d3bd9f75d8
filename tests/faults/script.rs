//! The fixed script every sweep replays: mixed sizes on three streams, frees, `record_stream` on
//! other streams (one of them held, so frees stay pending), `empty_cache`, and bursts that fill
//! the device to about 95 % and free every other block, so that growth meets a full device and
//! the remap, release-and-retry and out-of-memory paths run.

const MB: usize = 1 << 20;

/// The stream a test holds at times (its events stay pending until released).
pub const HELD: u64 = 3;

/// One step. Slots name allocations; a step on an empty slot (its allocation failed) is skipped.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Alloc {
        slot: usize,
        size: usize,
        stream: u64,
    },
    Free {
        slot: usize,
    },
    Record {
        slot: usize,
        stream: u64,
    },
    EmptyCache,
    Hold,
    Unhold,
}

/// xorshift64: the script depends on nothing but its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo) as u64) as usize
    }
}

/// `ops` steps for a device of `capacity` bytes.
pub fn script(ops: usize, capacity: usize, seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(ops);
    // Slots the generator expects live (it assumes every allocation succeeds), with sizes.
    let mut live: Vec<(usize, usize)> = Vec::new();
    let mut next_slot = 0;
    let mut held = false;
    let mut expected = 0usize;
    // Where the last fill burst ran: a burst that finds the device already full adds nothing,
    // and must not run again at the same place (that looped forever in long scripts).
    let mut burst_at = None;
    while out.len() < ops {
        let at = out.len();
        if at % 97 == 60 && burst_at != Some(at) {
            burst_at = Some(at);
            // Fill burst: 6-16 MiB blocks on streams 0 and 1 up to ~95 % of the device, then free
            // every other one: holes everywhere, the device nearly full.
            let mut burst = Vec::new();
            while expected < capacity / 20 * 19 && out.len() < ops {
                let size = rng.range(6 * MB, 16 * MB);
                let stream = rng.below(2);
                out.push(Op::Alloc {
                    slot: next_slot,
                    size,
                    stream,
                });
                burst.push((next_slot, size));
                live.push((next_slot, size));
                next_slot += 1;
                expected += size;
            }
            for (k, &(slot, size)) in burst.iter().enumerate() {
                if k % 2 == 0 && out.len() < ops {
                    out.push(Op::Free { slot });
                    live.retain(|&(s, _)| s != slot);
                    expected -= size;
                }
            }
            continue;
        }
        let roll = rng.below(100);
        if roll < 42 || live.is_empty() {
            let size = match rng.below(100) {
                0..50 => rng.range(1, MB + 1),
                50..85 => rng.range(MB + 1, 10 * MB),
                _ => rng.range(10 * MB, 40 * MB),
            };
            let stream = match rng.below(10) {
                0..7 => 0,
                7..9 => 1,
                _ => 2,
            };
            out.push(Op::Alloc {
                slot: next_slot,
                size,
                stream,
            });
            live.push((next_slot, size));
            next_slot += 1;
            expected += size;
        } else if roll < 77 || expected > capacity {
            let (slot, size) = live.swap_remove(rng.below(live.len() as u64) as usize);
            out.push(Op::Free { slot });
            expected -= size;
        } else if roll < 90 {
            let (slot, _) = live[rng.below(live.len() as u64) as usize];
            let stream = 1 + rng.below(HELD);
            out.push(Op::Record { slot, stream });
        } else if roll < 94 {
            out.push(Op::EmptyCache);
        } else {
            out.push(if held { Op::Unhold } else { Op::Hold });
            held = !held;
        }
    }
    out
}
