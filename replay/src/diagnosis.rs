//! Why a request ran out of memory: the allocator's state at that moment, the picture
//! `memory_summary()` cannot give (which free blocks of which sizes, on which stream, against the
//! request).

use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::units::human_bytes;

/// How many streams an [`OomMoment`] names (those holding the most free bytes); the rest are
/// counted. A log with 200,000 streams must not print 200,000 entries per report (issue 21).
pub const STREAMS_LISTED: usize = 8;

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
    /// Free blocks by the stream they are held for, most bytes first: the [`STREAMS_LISTED`]
    /// streams holding the most.
    pub free_by_stream: Vec<StreamFree>,
    /// The other streams holding free blocks: how many, and their free bytes.
    pub free_other_streams: (u64, u64),
    /// The simulated device's capacity.
    pub capacity_bytes: u64,
    /// The allocator ran out of virtual addresses, not of device memory: the driver refused to
    /// reserve even the request's own length (the OOM report's `address_space_exhausted`).
    pub address_space_exhausted: bool,
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
    /// The allocator said it ran out of virtual addresses.
    pub address_space_exhausted: bool,
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
    // By stream: O(log streams) a block, not a search of the list (issue 21).
    let mut streams: std::collections::BTreeMap<u64, StreamFree> = Default::default();
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
                    let s = streams.entry(stream).or_insert(StreamFree {
                        stream,
                        count: 0,
                        bytes: 0,
                        largest: 0,
                    });
                    s.count += 1;
                    s.bytes += size;
                    s.largest = s.largest.max(size);
                }
            }
        }
    }
    // Most bytes first; the stream number breaks ties so the output is deterministic.
    let mut streams: Vec<StreamFree> = streams.into_values().collect();
    streams.sort_by_key(|s| (std::cmp::Reverse(s.bytes), s.stream));
    let rest = streams.split_off(streams.len().min(STREAMS_LISTED));
    let free_other_streams = (rest.len() as u64, rest.iter().map(|s| s.bytes).sum());
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
        free_other_streams,
        capacity_bytes,
        address_space_exhausted: request.address_space_exhausted,
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
        if self.address_space_exhausted {
            out.push_str(
                "  the process's virtual address space ran out, not the device's memory: the driver refused to reserve addresses for this request (an expandable segment reserves 1.125 × the device: 128 TiB on x86-64 hold about 1,450 of an 80 GiB device's)\n",
            );
        }
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
            let (others, other_bytes) = self.free_other_streams;
            let rest = if others > 0 {
                format!("; and {others} more streams holding {}", b(other_bytes))
            } else {
                String::new()
            };
            out.push_str(&format!("  held free by {}{rest}\n", streams.join("; ")));
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

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_alloc::snapshot::{BlockInfo, SegmentInfo};
    use vmm_alloc::stats::PoolKind;
    use vmm_alloc::{DevAddr, StreamId};

    /// `n` segments of 2 MiB, segment `i` on stream `i` with `i + 1` free 512-byte blocks
    /// (stream `n - 1` holds the most).
    fn streams_holding_free_blocks(n: u64) -> Snapshot {
        let segments = (0..n)
            .map(|i| {
                let address = DevAddr::new((i + 1) << 32);
                let blocks = (0..=i)
                    .map(|j| BlockInfo {
                        address: DevAddr::new(address.get() + j * 1024),
                        size: 512,
                        requested_size: 0,
                        state: BlockState::Inactive,
                    })
                    .collect();
                SegmentInfo {
                    address,
                    total_size: 2 << 20,
                    mapped_size: 2 << 20,
                    allocated_size: 0,
                    stream: StreamId::sim(i),
                    pool: PoolKind::Small,
                    blocks,
                }
            })
            .collect();
        Snapshot { segments }
    }

    #[test]
    fn the_report_names_the_streams_holding_most_and_counts_the_rest() {
        let request = Request {
            event: 7,
            size: 1 << 20,
            stream: 0,
            recorded: false,
            served: false,
            address_space_exhausted: false,
        };
        let m = diagnose(
            request,
            &streams_holding_free_blocks(20),
            0,
            40 << 20,
            80 << 30,
        );
        let listed: Vec<u64> = m.free_by_stream.iter().map(|s| s.stream).collect();
        assert_eq!(
            listed,
            (12..20).rev().collect::<Vec<u64>>(),
            "most bytes first"
        );
        assert_eq!(m.free_by_stream[0].count, 20);
        // Streams 0..12 hold 1 + 2 + ... + 12 blocks of 512 bytes.
        assert_eq!(m.free_other_streams, (12, 78 * 512));
        let text = m.describe();
        assert!(
            text.contains("stream 0x13: 10.00 KiB in 20 blocks"),
            "{text}"
        );
        assert!(
            text.contains("; and 12 more streams holding 39.00 KiB"),
            "{text}"
        );
        assert!(!text.contains("stream 0xb:"), "{text}");
    }
}
