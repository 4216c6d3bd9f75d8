//! Every segment's address range, tiled into pieces: free ranges, blocks and gaps.
//!
//! Note [Pieces]: a segment's VA is covered, without overlap, by pieces in address order, each
//! linked to its neighbours: *free* (mapped, unused), *used* (a live or pending block) or *gap*
//! (not mapped, or a stuck chunk: nothing there can be handed out). Freeing a block asks only
//! "is the piece before me free, is the piece after me free", which the links answer without a
//! lookup, as in PyTorch's `Block` lists and TLSF's boundary tags; the hash maps this replaced
//! (free ranges by start and by end) cost ten hash operations per allocate + free pair, the
//! largest part of the hot path. Two free pieces never touch (they are merged), nor do two gaps.
//!
//! Pieces live in one arena per allocator and are named by index. Splitting and merging always
//! keep the *back* piece's index: the front half of a split is the new piece, and a merged piece
//! takes the index of the later of the two. So a segment's last piece keeps its index for the
//! segment's whole life (the segment finds its tiling from it), a free range keeps its index
//! while allocations are carved from its front, and unmapping chunks of one free range in
//! address order never invalidates the index of the range the next chunk lies in.

/// The index of a piece in the arena. Only the arena makes one (its field is private to this
/// module), so an id is one the arena handed out, [`NIL`], or the search key
/// [`PieceId::LEAST`]; as cheap as the `u32` it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PieceId(u32);

/// No piece: the neighbour of a segment's first or last piece.
pub(crate) const NIL: PieceId = PieceId(u32::MAX);

impl PieceId {
    /// The least id in their order: a search key that sorts before every real range of the same
    /// length and start (two ranges never share a start, so the id never decides: `FreeRange`).
    pub(crate) const LEAST: PieceId = PieceId(0);

    /// The node's position in the arena (side tables indexed like it: the chunk cache).
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a piece of a segment holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Mapped memory no block uses: in the best-fit index.
    Free,
    /// A live or pending block.
    Used,
    /// Unmapped (a hole) or a stuck chunk (Note [Stuck chunks] in `growth.rs`).
    Gap,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub(crate) start: u64,
    pub(crate) len: usize,
    pub(crate) prev: PieceId,
    pub(crate) next: PieceId,
    pub(crate) kind: Kind,
    /// The arena's clock (its low bits) when this piece last changed: made, split, merged or
    /// given another kind. Equal stamps mean the same piece, unchanged (Note [Chunk cache] in
    /// `chunk_cache.rs`). In the struct's padding: a piece stays 32 bytes.
    pub(crate) stamp: u32,
}

impl Piece {
    pub(crate) fn end(&self) -> u64 {
        self.start + self.len as u64
    }
}

/// The arena of every segment's pieces.
#[derive(Debug, Default)]
pub(crate) struct Pieces {
    nodes: Vec<Piece>,
    /// Indexes of released nodes, reused first.
    vacant: Vec<PieceId>,
    /// Changes of pieces so far: each change stamps the piece with the next value.
    clock: u64,
}

impl Pieces {
    pub(crate) fn get(&self, id: PieceId) -> &Piece {
        &self.nodes[id.index()]
    }

    /// The piece's kind, or `None` for `NIL`.
    pub(crate) fn kind(&self, id: PieceId) -> Option<Kind> {
        (id != NIL).then(|| self.nodes[id.index()].kind)
    }

    pub(crate) fn set_kind(&mut self, id: PieceId, kind: Kind) {
        let stamp = self.tick();
        let node = &mut self.nodes[id.index()];
        node.kind = kind;
        node.stamp = stamp;
    }

    /// Advances the clock; returns the stamp for the piece that changes.
    #[inline]
    fn tick(&mut self) -> u32 {
        self.clock += 1;
        self.clock as u32
    }

    /// Changes of pieces so far (Note [Chunk cache]).
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    fn alloc(&mut self, mut piece: Piece) -> PieceId {
        piece.stamp = self.tick();
        match self.vacant.pop() {
            Some(id) => {
                self.nodes[id.index()] = piece;
                id
            }
            None => {
                self.nodes.push(piece);
                PieceId((self.nodes.len() - 1) as u32)
            }
        }
    }

    /// A new tiling of `[start, start + len)`: one gap. Returns its piece, the tiling's last for
    /// good.
    pub(crate) fn new_tiling(&mut self, start: u64, len: usize) -> PieceId {
        self.alloc(Piece {
            start,
            len,
            prev: NIL,
            next: NIL,
            kind: Kind::Gap,
            stamp: 0,
        })
    }

    /// Splits piece `id` at `at`, strictly inside it: a new piece of the same kind takes the front
    /// `[start, at)` and is returned; `id` keeps the back.
    pub(crate) fn split_front(&mut self, id: PieceId, at: u64) -> PieceId {
        let p = self.nodes[id.index()];
        debug_assert!(p.start < at && at < p.end(), "split outside the piece");
        let front = self.alloc(Piece {
            start: p.start,
            len: (at - p.start) as usize,
            prev: p.prev,
            next: id,
            kind: p.kind,
            stamp: 0,
        });
        if p.prev != NIL {
            self.nodes[p.prev.index()].next = front;
        }
        let stamp = self.tick();
        let back = &mut self.nodes[id.index()];
        back.stamp = stamp;
        back.prev = front;
        back.start = at;
        back.len = (p.end() - at) as usize;
        front
    }

    /// Merges piece `id` into the piece after it, which grows to cover both and is returned;
    /// `id` is released. The caller has checked both are of one kind.
    pub(crate) fn merge_into_next(&mut self, id: PieceId) -> PieceId {
        let p = self.nodes[id.index()];
        let next = p.next;
        debug_assert!(next != NIL, "merging the last piece forward");
        let stamp = self.tick();
        let n = &mut self.nodes[next.index()];
        n.stamp = stamp;
        n.start = p.start;
        n.len += p.len;
        n.prev = p.prev;
        if p.prev != NIL {
            self.nodes[p.prev.index()].next = next;
        }
        self.vacant.push(id);
        next
    }

    /// The pieces of the tiling ending with `tail`, in address order.
    pub(crate) fn tiling(&self, tail: PieceId) -> Vec<PieceId> {
        let mut out = Vec::new();
        let mut id = tail;
        while id != NIL {
            out.push(id);
            id = self.nodes[id.index()].prev;
        }
        out.reverse();
        out
    }

    /// Releases every piece of the tiling ending with `tail`.
    pub(crate) fn release_tiling(&mut self, tail: PieceId) {
        let mut id = tail;
        while id != NIL {
            self.vacant.push(id);
            id = self.nodes[id.index()].prev;
        }
    }

    /// How many pieces are in use: for `check`, which compares it with the tilings.
    pub(crate) fn in_use(&self) -> usize {
        self.nodes.len() - self.vacant.len()
    }

    pub(crate) fn clear(&mut self) {
        self.nodes.clear();
        self.vacant.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(p: &Pieces, tail: PieceId) -> Vec<(u64, u64, Kind)> {
        p.tiling(tail)
            .into_iter()
            .map(|id| {
                let x = p.get(id);
                (x.start, x.end(), x.kind)
            })
            .collect()
    }

    #[test]
    fn splits_and_merges_keep_the_back_piece_and_the_links() {
        let mut p = Pieces::default();
        let tail = p.new_tiling(0, 100);
        let a = p.split_front(tail, 40); // [0,40) [40,100)
        let b = p.split_front(tail, 70); // [0,40) [40,70) [70,100)
        p.set_kind(b, Kind::Free);
        assert_eq!(
            spans(&p, tail),
            vec![
                (0, 40, Kind::Gap),
                (40, 70, Kind::Free),
                (70, 100, Kind::Gap)
            ]
        );
        assert_eq!(p.get(a).next, b);
        assert_eq!(p.get(tail).prev, b);
        assert_eq!(p.in_use(), 3);
        // Merging keeps the later index: the tail survives every merge.
        assert_eq!(p.merge_into_next(b), tail);
        assert_eq!(p.merge_into_next(a), tail);
        assert_eq!(spans(&p, tail), vec![(0, 100, Kind::Gap)]);
        assert_eq!(p.get(tail).prev, NIL);
        assert_eq!(p.in_use(), 1);
        // Released indexes are reused.
        let c = p.split_front(tail, 10);
        assert!(c == a || c == b);
        p.release_tiling(tail);
        assert_eq!(p.in_use(), 0);
    }
}
