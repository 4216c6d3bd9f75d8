//! Note [Hopeless growth] (`skip_hopeless_growth`, default on; PyTorch's preset off): a growth
//! that cannot get the memory it must map fails before it makes a driver call. What it can get is bounded: the device's room (the limit less what the
//! allocator holds, mapped and cached), the handle cache, and the fully-free chunks it may
//! harvest (Note [Remap]; the list the growth's first harvest makes anyway, Note [Harvest list],
//! here made first and kept for it). Where that bound is below the bytes the hole needs, the
//! growth would reserve a segment, harvest and map chunks, and then give them all back: calls
//! that change nothing a later request sees but the calls counted, made twice on every request
//! that raises an OOM (the first growth and the last resort's) and before every alias rescue
//! (Note [Alias rescue]).
//!
//! The bound never refuses a growth that could succeed: it counts every free chunk outside the
//! block's own range, whatever its stream (a synchronization or a park may be needed to take
//! it) and the cached handles whatever their lengths; a driver that refuses memory the limit
//! allows (another process's pressure) only lowers what the growth gets.

use crate::backend::Backend;
use crate::expandable::growth::{HarvestList, Harvester};
use crate::expandable::state::State;

impl<B: Backend> State<B> {
    /// Whether a growth that must map `need` bytes cannot get them (Note [Hopeless growth]);
    /// `exclude`: its stream and the range it relies on, whose chunks it may not harvest. Lists
    /// the harvest candidates into `harvest` when the device's room alone falls short.
    pub(super) fn hopeless(
        &mut self,
        need: usize,
        exclude: Harvester,
        harvest: &mut Option<HarvestList>,
    ) -> bool {
        if !self.config.skip_hopeless_growth {
            return false;
        }
        // The room and the cache: what creating and taking cached handles can give.
        let room = self.limit.saturating_sub(self.in_use(0)) + self.cache.bytes();
        if need <= room {
            return false;
        }
        if !self.config.remap_defrag {
            return true;
        }
        let list = match harvest {
            Some(list) => list,
            None => harvest.insert(self.harvest_candidates(exclude)),
        };
        let free: usize = list.cands.iter().map(|(_, c)| c.chunk.len).sum();
        if need <= room + free {
            return false;
        }
        // The list's allocation, for the next growth's.
        if let Some(list) = harvest.take() {
            self.harvest_spare = list.cands;
        }
        true
    }
}
