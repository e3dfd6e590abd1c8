//! The journal decision tables: what every observation a reader of a
//! group's files can make (a checkpoint file, a segment or its absence, a
//! segment header, the bytes at a record position) means, as one action.
//!
//! Recovery *acts* on the action (applies, truncates, quarantines, fails);
//! inspection (`berth store scan|verify`, backup's check of its copy)
//! *reports* it ([`Action::reported_as`]). Both get their observations from
//! the one scanner ([`crate::group_reader`]), so they cannot disagree about what
//! a file holds. docs/FORMAT.md §"Journal decision table" is this file in
//! words.
//!
//! Invariants:
//! - Every observation maps to exactly one row of its table (tested:
//!   `every_case_maps_to_exactly_one_action`), and every row is reachable.
//! - The tables are literal data; the functions below only look rows up.

/// What a reader does about an observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Use it (a record: apply; a segment: scan it; a checkpoint: start
    /// from the newest such one).
    Apply,
    /// Nothing to do, but worth telling the operator (a segment reclaimed
    /// before the replay start).
    Note,
    /// Cut the file here (a record) or remove it (a segment, a temporary
    /// checkpoint): a crash tore an unfinished write.
    Truncate,
    /// Do not use it, say so, go on without it (a damaged checkpoint: the
    /// previous one is tried).
    Skip,
    /// The segment's records end here: what follows is the zeros a
    /// prepared segment was filled with, not yet written. Recovery cuts
    /// them off; nothing was lost, so inspection says nothing.
    End,
    /// Copy the damaged bytes aside, report the loss, keep what follows.
    Quarantine,
    /// Stop: the store cannot be rebuilt safely without an operator.
    Fail,
}

/// How inspection reports an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// Not mentioned: the file is as the writer left it.
    Silent,
    /// A note: what a crash or reclamation normally leaves, handled
    /// without loss.
    Note,
    /// A problem: damage, or something recovery refuses.
    Problem,
}

impl Action {
    /// The one mapping from what recovery does to what inspection says.
    pub fn reported_as(self) -> Reported {
        match self {
            Action::Apply | Action::End => Reported::Silent,
            Action::Note | Action::Truncate => Reported::Note,
            Action::Skip | Action::Quarantine | Action::Fail => Reported::Problem,
        }
    }
}

/// What the bytes at a record position are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Checksum passes.
    Intact,
    /// Checksum fails or the length is impossible.
    Corrupt,
    /// The file ends before the frame does.
    Short,
    /// Every byte from here to the end of the file is zero: no record
    /// (its kind byte is never 0), whatever the checksum says. Checked
    /// wherever a position does not decode as a record, before the
    /// other frame cases.
    Zeros,
}

/// Whether an intact frame's body parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    Parses,
    Unparseable,
}

/// An intact record's sequence number against the expected one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// lsn == previous + 1 (or nothing precedes it to compare with).
    Next,
    /// lsn > previous + 1: records are missing.
    Gap,
    /// lsn <= previous: out of order.
    Behind,
    /// A `Hole` record (no lsn).
    Unnumbered,
}

/// One observation during a segment scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordCase {
    pub frame: Frame,
    pub body: Body,
    pub order: Order,
    /// The previous thing in the journal was damage (quarantined or a Hole)
    /// or a reclaimed segment.
    pub after_damage: bool,
    /// A valid record exists further on in this segment.
    pub valid_later: bool,
    /// This is the group's newest segment.
    pub last_segment: bool,
}

/// A row of [`RECORD_TABLE`]; `None` matches anything.
pub struct RecordRow {
    pub frame: &'static [Frame],
    pub body: Option<Body>,
    pub order: Option<Order>,
    pub after_damage: Option<bool>,
    pub valid_later: Option<bool>,
    pub last_segment: Option<bool>,
    pub action: Action,
    pub why: &'static str,
}

const BROKEN: &[Frame] = &[Frame::Corrupt, Frame::Short];
const INTACT: &[Frame] = &[Frame::Intact];
const ZEROS: &[Frame] = &[Frame::Zeros];

/// The record decision table.
#[rustfmt::skip]
pub const RECORD_TABLE: &[RecordRow] = &[
    RecordRow { frame: INTACT, body: Some(Body::Unparseable), order: None, after_damage: None, valid_later: None, last_segment: None,
        action: Action::Fail, why: "checksummed but not understood: newer format or a bug" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Next), after_damage: None, valid_later: None, last_segment: None,
        action: Action::Apply, why: "the expected record" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Unnumbered), after_damage: None, valid_later: None, last_segment: None,
        action: Action::Apply, why: "a Hole left by an earlier quarantine" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Gap), after_damage: Some(true), valid_later: None, last_segment: None,
        action: Action::Apply, why: "records lost to reported damage just before" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Gap), after_damage: Some(false), valid_later: None, last_segment: None,
        action: Action::Fail, why: "records missing with no damage to explain it" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Behind), after_damage: None, valid_later: None, last_segment: None,
        action: Action::Fail, why: "out of order: journal mixed up" },
    RecordRow { frame: BROKEN, body: None, order: None, after_damage: None, valid_later: Some(true), last_segment: None,
        action: Action::Quarantine, why: "damage in the middle: valid records follow" },
    RecordRow { frame: BROKEN, body: None, order: None, after_damage: None, valid_later: Some(false), last_segment: Some(true),
        action: Action::Truncate, why: "torn tail of the newest segment" },
    RecordRow { frame: BROKEN, body: None, order: None, after_damage: None, valid_later: Some(false), last_segment: Some(false),
        action: Action::Quarantine, why: "damage at the end of a sealed (synced) segment" },
    RecordRow { frame: ZEROS, body: None, order: None, after_damage: None, valid_later: None, last_segment: Some(true),
        action: Action::End, why: "the newest segment's unwritten rest (prepared with zeros)" },
    RecordRow { frame: ZEROS, body: None, order: None, after_damage: None, valid_later: None, last_segment: Some(false),
        action: Action::Quarantine, why: "zeros at the end of a sealed segment: sealing cuts them off, so bytes were lost" },
];

fn row_matches(row: &RecordRow, c: &RecordCase) -> bool {
    row.frame.contains(&c.frame)
        && row.body.is_none_or(|b| b == c.body)
        && row.order.is_none_or(|o| o == c.order)
        && row.after_damage.is_none_or(|v| v == c.after_damage)
        && row.valid_later.is_none_or(|v| v == c.valid_later)
        && row.last_segment.is_none_or(|v| v == c.last_segment)
}

/// The action for a record observation.
pub fn decide(case: &RecordCase) -> (Action, &'static str) {
    let row = the_row(RECORD_TABLE, case, row_matches, "record");
    (row.action, row.why)
}

/// The one row of `table` that matches `case` (the tables' invariant,
/// tested case by case; a release build takes the first).
fn the_row<'t, R, C: std::fmt::Debug>(
    table: &'t [R],
    case: &C,
    matches: impl Fn(&R, &C) -> bool,
    name: &str,
) -> &'t R {
    let mut rows = table.iter().filter(|r| matches(r, case));
    let row = rows
        .next()
        .unwrap_or_else(|| panic!("{name} table covers every case, not {case:?}"));
    debug_assert!(rows.next().is_none(), "{name} table overlaps at {case:?}");
    row
}

/// What a segment's header says, or that the segment is not there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    Ok,
    /// Short or checksum mismatch.
    Torn,
    /// Checksum passes but it is not this group's segment of this number.
    Foreign,
    /// No file of this number, though the journal around it has files
    /// (`last_segment` false), or the segment the newest checkpoint
    /// replays from, which it saw holding records, is gone with every
    /// later one (`last_segment` true: the journal's tail is lost).
    Missing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentCase {
    pub header: Header,
    pub last_segment: bool,
    /// A valid record follows the header position anyway.
    pub valid_records: bool,
    /// The segment lies wholly before the checkpoint's replay position.
    pub before_replay: bool,
}

/// A row of [`SEGMENT_TABLE`]; `None` matches anything.
pub struct SegmentRow {
    pub header: Header,
    pub last_segment: Option<bool>,
    pub valid_records: Option<bool>,
    pub before_replay: Option<bool>,
    pub action: Action,
    pub why: &'static str,
}

/// The segment decision table.
#[rustfmt::skip]
pub const SEGMENT_TABLE: &[SegmentRow] = &[
    SegmentRow { header: Header::Ok, last_segment: None, valid_records: None, before_replay: None, action: Action::Apply,
        why: "scan it" },
    SegmentRow { header: Header::Torn, last_segment: Some(true), valid_records: Some(false), before_replay: None, action: Action::Truncate,
        why: "creation of the newest segment torn by a crash" },
    SegmentRow { header: Header::Torn, last_segment: Some(true), valid_records: Some(true), before_replay: None, action: Action::Fail,
        why: "damaged header over valid records" },
    SegmentRow { header: Header::Torn, last_segment: Some(false), valid_records: None, before_replay: None, action: Action::Fail,
        why: "damaged header of a sealed segment" },
    SegmentRow { header: Header::Foreign, last_segment: None, valid_records: None, before_replay: None, action: Action::Fail,
        why: "not this group's segment, or another format version" },
    SegmentRow { header: Header::Missing, last_segment: None, valid_records: None, before_replay: Some(true), action: Action::Note,
        why: "segment reclaimed (before the checkpoint's replay start)" },
    SegmentRow { header: Header::Missing, last_segment: Some(false), valid_records: None, before_replay: Some(false), action: Action::Fail,
        why: "segment missing from the journal to replay" },
    SegmentRow { header: Header::Missing, last_segment: Some(true), valid_records: None, before_replay: Some(false), action: Action::Fail,
        why: "the journal's tail is missing: the checkpoint replays from a segment that is gone" },
];

fn segment_row_matches(row: &SegmentRow, c: &SegmentCase) -> bool {
    row.header == c.header
        && row.last_segment.is_none_or(|v| v == c.last_segment)
        && row.valid_records.is_none_or(|v| v == c.valid_records)
        && row.before_replay.is_none_or(|v| v == c.before_replay)
}

/// The action for a segment observation.
pub fn decide_segment(case: &SegmentCase) -> (Action, &'static str) {
    let row = the_row(SEGMENT_TABLE, case, segment_row_matches, "segment");
    (row.action, row.why)
}

/// What a checkpoint file is, or what stands in for one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointCase {
    /// Decodes and checks out.
    Valid,
    /// Checksum fails, bad magic, another group, a body that does not parse,
    /// or unreadable.
    Damaged,
    /// Checksum passes but another format version wrote it.
    OtherVersion,
    /// The temporary file of a checkpoint being written (or left by a
    /// crash before its rename).
    Unfinished,
    /// No valid checkpoint; the journal starts at segment 1 (or is empty).
    NoneJournalWhole,
    /// No valid checkpoint; the journal's first segments were reclaimed.
    NoneJournalReclaimed,
}

/// A row of a table keyed by one case value ([`CHECKPOINT_TABLE`],
/// [`LAYOUT_TABLE`]).
pub struct CaseRow<C> {
    pub case: C,
    pub action: Action,
    pub why: &'static str,
}

/// A row of [`CHECKPOINT_TABLE`].
pub type CheckpointRow = CaseRow<CheckpointCase>;

/// The action for `case` in a table keyed by case values.
fn decide_case<C: PartialEq + std::fmt::Debug>(
    table: &[CaseRow<C>],
    case: &C,
    name: &str,
) -> (Action, &'static str) {
    let row = the_row(table, case, |r, c| r.case == *c, name);
    (row.action, row.why)
}

/// The checkpoint decision table (files are looked at newest first; the
/// first `Apply` is the one the index starts from).
#[rustfmt::skip]
pub const CHECKPOINT_TABLE: &[CheckpointRow] = &[
    CheckpointRow { case: CheckpointCase::Valid, action: Action::Apply,
        why: "a valid checkpoint: the newest one is replayed from" },
    CheckpointRow { case: CheckpointCase::Damaged, action: Action::Skip,
        why: "invalid checkpoint ignored; the previous one is tried" },
    CheckpointRow { case: CheckpointCase::OtherVersion, action: Action::Fail,
        why: "checkpoint of another format version: falling back past it could replay a journal it has moved on from" },
    CheckpointRow { case: CheckpointCase::Unfinished, action: Action::Truncate,
        why: "checkpoint being written (or left by a crash; removed at start)" },
    CheckpointRow { case: CheckpointCase::NoneJournalWhole, action: Action::Apply,
        why: "no valid checkpoint: the whole journal is replayed" },
    CheckpointRow { case: CheckpointCase::NoneJournalReclaimed, action: Action::Fail,
        why: "no valid checkpoint, and the journal's first segments were reclaimed" },
];

/// The action for a checkpoint observation.
pub fn decide_checkpoint(case: CheckpointCase) -> (Action, &'static str) {
    decide_case(CHECKPOINT_TABLE, &case, "checkpoint")
}

/// What the store's layout (its manifest and group directories) shows
/// before any group is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutCase {
    /// The manifest's group has its directory.
    GroupDirPresent,
    /// The manifest names a group whose directory is not there. A new
    /// store, a restore and a reshape create every group directory before
    /// writing the manifests, so this is a directory deleted or lost.
    GroupDirMissing,
    /// The manifest's `group_count` is 0 or above `LOG_GROUPS_MAX`: berth
    /// never writes one (0 would divide by zero, a huge one spawn that many
    /// threads).
    GroupCountOutOfRange,
}

/// A row of [`LAYOUT_TABLE`].
pub type LayoutRow = CaseRow<LayoutCase>;

/// The layout decision table.
#[rustfmt::skip]
pub const LAYOUT_TABLE: &[LayoutRow] = &[
    LayoutRow { case: LayoutCase::GroupDirPresent, action: Action::Apply,
        why: "recover the group from its directory" },
    LayoutRow { case: LayoutCase::GroupDirMissing, action: Action::Fail,
        why: "group directory missing from an existing store: opening it empty would drop its messages" },
    LayoutRow { case: LayoutCase::GroupCountOutOfRange, action: Action::Fail,
        why: "manifest group_count out of range" },
];

/// The action for a layout observation.
pub fn decide_layout(case: LayoutCase) -> (Action, &'static str) {
    decide_case(LAYOUT_TABLE, &case, "layout")
}

#[cfg(test)]
mod tests;
