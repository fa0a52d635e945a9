//! The operations: `impl State` blocks by job, with the thin `impl Fs`
//! wrappers that take the lock: names and links ([`namespace`]), files'
//! attributes and lifetimes ([`files`]), extended attributes and ACLs
//! ([`xattr`], [`acl`]), file data ([`data`]: read, write, store, trim;
//! patch planning in [`patch`]), commits and the bounds that call for them
//! ([`commit`]), and usage accounting ([`usage`]).

pub(crate) mod acl;
pub(crate) mod commit;
pub(crate) mod data;
pub(crate) mod files;
pub(crate) mod namespace;
pub(crate) mod patch;
pub(crate) mod usage;
pub(crate) mod xattr;
