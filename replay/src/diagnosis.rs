//! Why a request ran out of memory: the allocator's state at that moment, the picture
//! `memory_summary()` cannot give (which free blocks of which sizes, on which stream, against the
//! request).

use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::units::human_bytes;

/// Upper bounds (exclusive) of the free-block size classes; the last class is unbounded.
pub const SIZE_CLASSES: [u64; 4] = [1 << 20, 10 << 20, 100 << 20, 1 << 30];

/// Free blocks of one size class.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SizeClass {
    /// Blocks at least this large (0 for the first class).
    pub min_bytes: u64,
    /// Blocks below this size (`None`: unbounded).
    pub below_bytes: Option<u64>,
    /// How many free blocks.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Free (cached, mapped) blocks held for one stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StreamFree {
    /// The stream, as the trace numbers it.
    pub stream: u64,
    /// How many free blocks.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The largest of them.
    pub largest: u64,
}

/// The allocator's state when a request could not be served (or, for a request the traced
/// program's allocator failed, when the replayed one was asked for it).
#[derive(Clone, PartialEq, Debug)]
pub struct OomMoment {
    /// Index of the event among those replayed (initial blocks first).
    pub event: u64,
    /// Bytes requested.
    pub request: u64,
    /// The request's stream.
    pub stream: u64,
    /// The traced program ran out here too (a recorded `oom` entry).
    pub recorded: bool,
    /// This allocator served the request (only possible for a recorded one: a replayed OOM is
    /// by definition not served).
    pub served: bool,
    /// Live requested bytes just before the request.
    pub live_bytes: u64,
    /// Physical memory the allocator held.
    pub reserved_bytes: u64,
    /// Of it, mapped bytes in no live block: reserved but unallocated.
    pub reserved_unallocated_bytes: u64,
    /// The largest free mapped block, any stream.
    pub largest_free_bytes: u64,
    /// The largest free mapped block on the request's stream (the only ones it may use).
    pub largest_free_on_stream_bytes: u64,
    /// The fragmentation picture: free blocks by size class ([`SIZE_CLASSES`]).
    pub free_by_size: Vec<SizeClass>,
    /// Free blocks by the stream they are held for, most bytes first.
    pub free_by_stream: Vec<StreamFree>,
    /// The simulated device's capacity.
    pub capacity_bytes: u64,
}

impl OomMoment {
    /// Live memory the request needs: what is live plus the request.
    pub fn needed_live_bytes(&self) -> u64 {
        self.live_bytes.saturating_add(self.request)
    }

    /// No allocator could have served it: live memory plus the request exceed the device.
    pub fn impossible(&self) -> bool {
        self.needed_live_bytes() > self.capacity_bytes
    }
}

/// What an [`OomMoment`] is built from besides the allocator's snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// Index of the event.
    pub event: u64,
    /// Bytes requested.
    pub size: u64,
    /// Its stream.
    pub stream: u64,
    /// A recorded `oom` entry.
    pub recorded: bool,
    /// Served by the replayed allocator.
    pub served: bool,
}

/// The picture of `snapshot` (taken before the request was served) for `request`.
pub fn diagnose(
    request: Request,
    snapshot: &Snapshot,
    live_bytes: u64,
    reserved_bytes: u64,
    capacity_bytes: u64,
) -> OomMoment {
    let mut classes: Vec<SizeClass> = std::iter::once(0)
        .chain(SIZE_CLASSES)
        .zip(SIZE_CLASSES.into_iter().map(Some).chain([None]))
        .map(|(min_bytes, below_bytes)| SizeClass {
            min_bytes,
            below_bytes,
            ..SizeClass::default()
        })
        .collect();
    let mut streams: Vec<StreamFree> = Vec::new();
    let (mut largest, mut largest_here, mut allocated) = (0u64, 0u64, 0u64);
    for seg in &snapshot.segments {
        let stream = seg.stream.raw();
        for b in &seg.blocks {
            let size = b.size as u64;
            match b.state {
                BlockState::ActiveAllocated | BlockState::ActivePendingFree => allocated += size,
                BlockState::Unmapped => {}
                BlockState::Inactive => {
                    largest = largest.max(size);
                    if stream == request.stream {
                        largest_here = largest_here.max(size);
                    }
                    let class = SIZE_CLASSES.iter().take_while(|&&c| size >= c).count();
                    classes[class].count += 1;
                    classes[class].bytes += size;
                    match streams.iter_mut().find(|s| s.stream == stream) {
                        Some(s) => {
                            s.count += 1;
                            s.bytes += size;
                            s.largest = s.largest.max(size);
                        }
                        None => streams.push(StreamFree {
                            stream,
                            count: 1,
                            bytes: size,
                            largest: size,
                        }),
                    }
                }
            }
        }
    }
    // Most bytes first; the stream number breaks ties so the output is deterministic.
    streams.sort_by_key(|s| (std::cmp::Reverse(s.bytes), s.stream));
    OomMoment {
        event: request.event,
        request: request.size,
        stream: request.stream,
        recorded: request.recorded,
        served: request.served,
        live_bytes,
        reserved_bytes,
        reserved_unallocated_bytes: reserved_bytes.saturating_sub(allocated),
        largest_free_bytes: largest,
        largest_free_on_stream_bytes: largest_here,
        free_by_size: classes,
        free_by_stream: streams,
        capacity_bytes,
    }
}

impl OomMoment {
    /// The moment in words, a few lines: the verdict, the memory figures, the free blocks by size
    /// and by stream.
    pub fn describe(&self) -> String {
        let b = |n: u64| human_bytes(n);
        let what = if self.recorded {
            "the traced program ran out here"
        } else {
            "out of memory"
        };
        let mut out = format!(
            "event {}: {what}: {} requested on stream {:#x}",
            self.event,
            b(self.request),
            self.stream
        );
        if self.recorded {
            out.push_str(if self.served {
                "; this allocator served it"
            } else {
                "; this allocator could not serve it either"
            });
        }
        out.push('\n');
        if self.impossible() {
            out.push_str(&format!(
                "  no allocator could have served this: the request needs {} of live memory ({} live + {} requested) on a {} device\n",
                b(self.needed_live_bytes()),
                b(self.live_bytes),
                b(self.request),
                b(self.capacity_bytes)
            ));
        }
        out.push_str(&format!(
            "  live {}, reserved {}, reserved but unallocated {}; largest free block {} ({} on the request's stream) vs {} requested\n",
            b(self.live_bytes),
            b(self.reserved_bytes),
            b(self.reserved_unallocated_bytes),
            b(self.largest_free_bytes),
            b(self.largest_free_on_stream_bytes),
            b(self.request)
        ));
        let classes: Vec<String> = self
            .free_by_size
            .iter()
            .filter(|c| c.count > 0)
            .map(|c| format!("{} of {} ({})", c.count, c.label(), b(c.bytes)))
            .collect();
        if !classes.is_empty() {
            out.push_str(&format!("  free blocks: {}\n", classes.join(", ")));
        }
        let streams: Vec<String> = self
            .free_by_stream
            .iter()
            .map(|s| {
                format!(
                    "stream {:#x}: {} in {} blocks (largest {})",
                    s.stream,
                    b(s.bytes),
                    s.count,
                    b(s.largest)
                )
            })
            .collect();
        if !streams.is_empty() {
            out.push_str(&format!("  held free by {}\n", streams.join("; ")));
        }
        out
    }
}

impl SizeClass {
    /// `< 1 MiB`, `1 MiB-10 MiB`, ..., `>= 1 GiB`.
    pub fn label(&self) -> String {
        match (self.min_bytes, self.below_bytes) {
            (0, Some(hi)) => format!("< {}", human_bytes(hi)),
            (lo, Some(hi)) => format!("{}-{}", human_bytes(lo), human_bytes(hi)),
            (lo, None) => format!(">= {}", human_bytes(lo)),
        }
    }
}
