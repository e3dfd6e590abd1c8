//! The group writer's encode buffer: the bytes of a batch, kept where a
//! direct append can write them from without copying them first.
//!
//! A write past the page cache (`direct.rs`) covers whole aligned blocks
//! of the file, from memory aligned the same way. The writer knows the
//! file offset its next batch goes to, so it places the batch's first byte
//! at the same position within a memory block as it will have within a
//! disk block ([`AppendBuf::place`]), with room in front for that block's
//! earlier bytes and after it for the zeros to the block's end. The
//! direct append fills that room and writes the run as it is.
//!
//! Invariants:
//! - [`AppendBuf::bytes`] are exactly what was pushed since the buffer was
//!   last emptied, wherever they sit in memory: placing is an optimisation
//!   that a write may find broken (the memory moved when it grew) and then
//!   copies around, never a condition of correctness.
//! - The room around the bytes is scratch: [`AppendBuf::with_blocks`]
//!   hands it to the caller for one write and takes it back after.

/// The alignment of a direct write's offset, length and memory, and so of
/// a placed batch: a page, which covers devices of 512-byte and 4 KiB
/// logical blocks.
pub(crate) const BLOCK: usize = 4096;

/// Bytes to append at a known offset; see the module documentation.
#[derive(Debug, Default)]
pub struct AppendBuf {
    /// The room in front, then the bytes.
    mem: Vec<u8>,
    /// Where the bytes start in `mem`.
    start: usize,
    /// The most bytes one write has held: the room reserved from now on,
    /// so that a batch as large as the last ones does not move the memory.
    high: usize,
}

impl AppendBuf {
    /// An empty buffer holding no memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer that places batches of up to `bytes` without
    /// their memory moving as they are pushed.
    pub fn with_room(bytes: usize) -> Self {
        Self {
            high: bytes,
            ..Self::default()
        }
    }

    /// The bytes to append.
    pub fn bytes(&self) -> &[u8] {
        &self.mem[self.start..]
    }

    /// How many bytes there are to append.
    pub fn len(&self) -> usize {
        self.mem.len() - self.start
    }

    /// Whether there is nothing to append.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory held, room included.
    pub fn capacity(&self) -> usize {
        self.mem.capacity()
    }

    /// The vector encoders push the bytes onto. Only push onto it: what is
    /// in it before [`AppendBuf::len`]'s bytes is the room in front.
    pub fn encoder(&mut self) -> &mut Vec<u8> {
        &mut self.mem
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.mem.extend_from_slice(bytes);
    }

    /// Keeps the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.mem.truncate(self.start + len);
    }

    /// Forgets the bytes, keeping the memory and the room in front.
    pub fn clear(&mut self) {
        self.mem.truncate(self.start);
    }

    /// Gives the memory back.
    pub fn release(&mut self) {
        *self = Self {
            high: self.high,
            ..Self::default()
        };
    }

    /// Places the bytes pushed from now on for a write at file offset
    /// `offset`, when there are none yet (with bytes, it does nothing):
    /// their first byte at the same position within a memory block as
    /// `offset` within a disk block, with room reserved for a batch as
    /// large as the largest so far.
    pub fn place(&mut self, offset: u64) {
        if !self.is_empty() {
            return;
        }
        let head = usize::try_from(offset % BLOCK as u64).expect("less than a block");
        let room = 3 * BLOCK + self.high;
        if self.mem.capacity() < room {
            self.mem.clear();
            self.mem.reserve(room);
        }
        // Everything in `mem` is room already written once: only room
        // beyond it is filled.
        self.start = self.mem.as_ptr().align_offset(BLOCK) + head;
        if self.mem.len() < self.start {
            self.mem.resize(self.start, 0);
        } else {
            self.mem.truncate(self.start);
        }
    }

    /// Places the bytes pushed from now on for a write at file offset
    /// `offset`, as [`AppendBuf::place`] does, with room for at least
    /// `bytes` of them: a copy of that many bytes then lies where the
    /// write goes from.
    pub fn place_with_room(&mut self, offset: u64, bytes: usize) {
        self.high = self.high.max(bytes);
        self.place(offset);
    }

    /// Calls `write` with the whole `block`-aligned blocks around the
    /// bytes, as they would lie in a file where the bytes start at
    /// `offset` (aligned in memory too), and with where the bytes start in
    /// that run. The run's bytes before them are the caller's to fill; the
    /// ones after them are zeros. `None`, without calling `write`, when
    /// the bytes are not placed for `offset` and `block` (never placed,
    /// placed for another offset, or moved since by growing).
    pub fn with_blocks<T>(
        &mut self,
        offset: u64,
        block: usize,
        write: impl FnOnce(&mut [u8], usize) -> T,
    ) -> Option<T> {
        let len = self.len();
        self.high = self.high.max(len);
        let (from, head, padded) = self.run(offset, block)?;
        self.mem.resize(from + padded, 0);
        let out = write(&mut self.mem[from..from + padded], head);
        self.mem.truncate(self.start + len);
        Some(out)
    }

    /// Whether the bytes are placed for a write at `offset` in blocks of
    /// `block` bytes: whether [`AppendBuf::with_blocks`] would write them
    /// from where they lie.
    pub fn is_placed_for(&self, offset: u64, block: usize) -> bool {
        self.run(offset, block).is_some()
    }

    /// Where the aligned run around the bytes starts in `mem`, where the
    /// bytes start in it, and its length; `None` unless the bytes are
    /// placed for `offset` and the run fits the memory held.
    fn run(&self, offset: u64, block: usize) -> Option<(usize, usize, usize)> {
        let head = usize::try_from(offset % block as u64).expect("less than a block");
        let from = self.start.checked_sub(head)?;
        let padded = (head + self.len()).div_ceil(block) * block;
        let aligned = self.mem[from..].as_ptr().align_offset(block) == 0;
        (aligned && self.mem.capacity() >= from + padded).then_some((from, head, padded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_bytes_lie_as_they_will_in_the_file_with_zeros_after() {
        let mut buf = AppendBuf::new();
        // A first batch as large sizes the room for the next ones.
        buf.place(0);
        buf.extend_from_slice(&[0u8; 5003]);
        let _ = buf.with_blocks(0, BLOCK, |_, _| ());
        for offset in [0u64, 1, 100, 4095, 4096, 4097, 123_456] {
            buf.clear();
            buf.place(offset);
            buf.extend_from_slice(b"abc");
            buf.encoder().extend_from_slice(&[7u8; 5000]);
            assert_eq!(buf.len(), 5003);
            let head = (offset % BLOCK as u64) as usize;
            let seen = buf.with_blocks(offset, BLOCK, |run, at| {
                assert_eq!(at, head);
                assert_eq!(run.as_ptr().align_offset(BLOCK), 0);
                assert_eq!(run.len(), (head + 5003).div_ceil(BLOCK) * BLOCK);
                assert_eq!(&run[at..at + 3], b"abc");
                assert!(run[at + 3..at + 5003].iter().all(|&b| b == 7));
                assert!(run[at + 5003..].iter().all(|&b| b == 0));
                run[..at].fill(9);
            });
            assert_eq!(seen, Some(()), "offset {offset}");
            // The room is scratch: the bytes are what was pushed.
            assert_eq!(&buf.bytes()[..3], b"abc");
            assert_eq!(buf.len(), 5003);
        }
    }

    #[test]
    fn bytes_not_placed_for_the_offset_are_left_to_the_caller() {
        let mut buf = AppendBuf::new();
        buf.extend_from_slice(b"never placed");
        assert!(!buf.is_placed_for(0, BLOCK));
        assert_eq!(buf.with_blocks(0, BLOCK, |_, _| ()), None);

        let mut buf = AppendBuf::new();
        buf.place(10);
        buf.extend_from_slice(b"placed for 10");
        assert!(!buf.is_placed_for(11, BLOCK));
        assert_eq!(buf.with_blocks(11, BLOCK, |_, _| ()), None);
        assert!(buf.is_placed_for(10, BLOCK));
        assert_eq!(buf.with_blocks(10, BLOCK, |_, _| ()), Some(()));
        assert_eq!(buf.bytes(), b"placed for 10");
    }

    #[test]
    fn a_batch_larger_than_the_last_ones_is_placed_again_after_it_moved() {
        let mut buf = AppendBuf::new();
        buf.place(0);
        buf.extend_from_slice(&vec![1u8; 10 * BLOCK]);
        // The reserve was for an empty history: the memory may have moved.
        let _ = buf.with_blocks(0, BLOCK, |_, _| ());
        buf.clear();
        buf.place(0);
        buf.extend_from_slice(&vec![2u8; 10 * BLOCK]);
        assert_eq!(buf.with_blocks(0, BLOCK, |_, _| ()), Some(()));
        assert!(buf.bytes().iter().all(|&b| b == 2));
    }

    #[test]
    fn placing_bytes_already_pushed_keeps_them() {
        let mut buf = AppendBuf::new();
        buf.place(0);
        buf.extend_from_slice(b"kept");
        buf.place(99);
        assert_eq!(buf.bytes(), b"kept");
        buf.truncate(2);
        assert_eq!(buf.bytes(), b"ke");
        buf.clear();
        assert!(buf.is_empty());
        buf.release();
        assert_eq!(buf.capacity(), 0);
    }
}
