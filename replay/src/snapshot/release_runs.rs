//! What a run of segment releases was: `empty_cache()`, malloc's release-and-retry, or the
//! release before an OOM (Note [Release runs] in the module docs).

use super::entries::{Action, Entry};

pub(super) fn classify_run(entries: &[Entry<'_>], end: usize) -> RunKind {
    let next = entries.get(end + 1);
    if next.is_some_and(|e| e.action == Action::Oom) {
        return RunKind::BeforeOom;
    }
    let (Some(seg), Some(alloc)) = (next, entries.get(end + 2)) else {
        return RunKind::EmptyCache;
    };
    if !matches!(seg.action, Action::SegmentAlloc | Action::SegmentMap)
        || alloc.action != Action::Alloc
    {
        return RunKind::EmptyCache;
    }
    let retry = match (entries.get(end).and_then(|e| e.frames), alloc.frames) {
        (Some(run), Some(call)) => run.same_as(call),
        _ => match (seg.addr, alloc.addr) {
            (Some(s), Some(a)) => {
                a < s.saturating_add(i128::from(seg.size))
                    && s < a.saturating_add(i128::from(alloc.size.max(1)))
            }
            _ => false,
        },
    };
    if retry {
        RunKind::AllocRetry
    } else {
        RunKind::EmptyCache
    }
}

pub(super) enum RunKind {
    EmptyCache,
    AllocRetry,
    BeforeOom,
}
