//! The exit codes of `berth`'s tools, in one place so that every command
//! (and the scripts that call them) agrees on what each means. A leaf
//! module: it imports nothing, so any command may import it.
//!
//! 0 = done (and, for checks, nothing found); 1 = the check found
//! problems; 2 = the input could not be read at all (bad arguments or
//! configuration, not a store, I/O error).

/// A check (`store verify`, `events`) found at least one problem.
pub const EXIT_PROBLEMS: u8 = 1;
/// The store, file or configuration could not be read (or the arguments
/// are wrong).
pub const EXIT_UNREADABLE: u8 = 2;
