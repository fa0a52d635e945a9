//! History: named snapshots ([`snapshot`]), automatic points and their
//! retention ([`points`]), forwards that let snapshots read blocks the
//! cleaner moved ([`forward`]), and the change feed ([`feed`]).

pub(crate) mod feed;
pub(crate) mod forward;
pub(crate) mod points;
pub(crate) mod snapshot;
