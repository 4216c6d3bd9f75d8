//! Note [Kept pages] (`keep_after_retry`, default on; PyTorch's preset off): the pages of other
//! streams that a served last resort unmapped (Note [Pages put back] in `put_back.rs`) used to
//! be released at the call's end, and those streams' next growths created them again: on
//! `inference-server` seed 1 at its smallest capacity every one of the 189 releases was such a
//! page, 1.41 × the peak reserved created in all. Now they are kept, each a handle of its
//! length, for the growths that would create a page of that length: a growth that would create
//! takes a kept handle of exactly its length instead, and one that finds none releases kept
//! handles (the largest first) until its create fits.
//!
//! For every decision a kept page is what it would be without the setting: room on the device.
//! `in_use` leaves kept pages out, so the headroom, the tail rule, the hopeless check, the
//! rescue's plan and every "does it fit" see what they would see had the pages been released;
//! a growth rolled back returns a kept handle to the kept pages, as the handle it would have
//! created would have been released. Only the handle behind a page the growth would have created
//! differs, and the create and release calls go (`tests/all/kept_pages.rs` replays seeded
//! 4-stream runs both ways and compares every step). Seeds 1–18 at min capacity (Sim): the same
//! capacity and synchronizations on every case; bytes created above 1.1 × the peak on 6 of 36
//! server cases instead of 34, and on 32 streams the median 1.78 × instead of 5.73 ×.
//!
//! Kept as cached handles instead (taken by any growth that found them, counted as memory held)
//! they made growths of other streams take them where without them the growth would have
//! reached the last resort, which unmaps every stream's free pages and so gathers the free
//! memory scattered over the streams: the smallest capacity rose above pytorch-expandable's on
//! 6 more of 36 server cases (POLICY.md, "Other streams' pages kept after the last resort").
//!
//! A kept page is memory the process holds (`held_bytes`, `handle_cache_bytes`): an OOM raised
//! and `empty_cache` release them all, and a create the driver refuses below the limit (memory
//! outside the allocator, another process) releases them and tries again.

use crate::backend::{Backend, CallKind, PhysHandle};
use crate::error::BackendError;
use crate::expandable::growth::Source;
use crate::expandable::state::State;
use crate::mechanism::counters::track;

impl<B: Backend> State<B> {
    /// A handle of `len` bytes the device must give, `held` bytes already taken by the caller
    /// and not yet counted as reserved: a kept one of that length, else created, kept pages
    /// released first for its room, and all of them if the driver refuses it below the limit
    /// (Note [Kept pages]).
    pub(crate) fn new_handle(
        &mut self,
        held: usize,
        len: usize,
    ) -> Result<(PhysHandle, Source), BackendError> {
        if let Some(h) = self.kept.take_exact(len) {
            return Ok((h, Source::Kept));
        }
        self.release_kept_for_room(held, len);
        let mut created = track(&mut self.stats, CallKind::Create, self.backend.create(len));
        if created.as_ref().is_err_and(BackendError::is_out_of_memory) && self.kept.count() > 0 {
            // Less room than the limit leaves (another process, memory outside the allocator).
            self.release_kept();
            created = track(&mut self.stats, CallKind::Create, self.backend.create(len));
        }
        let h = created?;
        self.stats.bytes_created += len as u64;
        Ok((h, Source::Created))
    }

    /// Releases kept pages, the largest first, until a create of `want` bytes (with `held` taken
    /// by the growth in progress) fits in the device beside those left (Note [Kept pages]). A
    /// release the driver refuses leaves the handle in the handle cache, as any release.
    pub(crate) fn release_kept_for_room(&mut self, held: usize, want: usize) {
        while self.in_use(held) + self.kept.bytes() + want > self.limit {
            let Some((h, len)) = self.kept.take_largest() else {
                break;
            };
            let _ = self.release_or_keep(h, len);
        }
    }

    /// Releases every kept page (an OOM raised, `empty_cache`).
    pub(crate) fn release_kept(&mut self) {
        while let Some((h, len)) = self.kept.take_largest() {
            let _ = self.release_or_keep(h, len);
        }
    }
}
