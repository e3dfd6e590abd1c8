//! Where a record is in a log group's segments; shared by the message
//! index and the streams' sparse index (so neither imports the other).

/// Where a record is: segment, byte offset, total record length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub seg: u32,
    pub offset: u32,
    pub len: u32,
}
