//! File data: reads of stored and buffered chunks, in [`read`]'s words;
//! buffering writes ([`write`]); storing a group's buffers at commit
//! ([`store`]); and releasing stored chunks, truncation, holes and
//! reservations ([`trim`]).
//!
//! Invariants (checked by fsck, and where they are established in debug
//! builds):
//! - a file has no chunk at or past `ceil(size / chunk_size)`, and no chunk
//!   holds bytes past `size`;
//! - `alloc` is the sum of the lengths of the file's chunks, buffered
//!   chunks counted at their buffered length.

mod read;
mod store;
mod trim;
mod write;
