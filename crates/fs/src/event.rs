//! The change records' events: what one operation did to an inode, and
//! the record one commit group writes of them (read by the change feed,
//! [`crate::history::feed`]; written by the commit group).

use zlogfs_engine::bytes::{Put, Reader};

use crate::error::Result;
use crate::keys::{unzigzag, zigzag, Ino, Kind, Time};

/// A change record's encoded size at most: one engine value.
pub const RECORD_MAX: usize = zlogfs_engine::MAX_VALUE;

/// A change record's header at most (varint seconds, nanoseconds and
/// event count).
pub(crate) const RECORD_HEADER_MAX: usize = 10 + 5 + 10;

/// The events one operation notes at most, in record bytes: a rename that
/// exchanges two entries of 255-byte names moves two links, and data and
/// metadata events come with them. An operation joins a group only while
/// this much is left in its change record ([`crate::state::group::Group::changes_full`]).
pub(crate) const OP_EVENTS_MAX: usize = 4096;

/// A directory entry: (directory, name).
pub type Link = (Ino, Vec<u8>);

/// What one operation did to an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// Made (its first link is where its parent says: the feed finds
    /// its name there, so the record does not repeat it).
    Made,
    /// Another link added.
    Linked(Link),
    /// A link removed (with the last one, the inode is gone).
    Unlinked(Link),
    /// A link moved (rename).
    Moved(Link, Link),
    /// Its data changed (write, truncate, fallocate).
    Data,
    /// Its metadata changed (mode, owner, times, xattrs).
    Meta,
}

/// One change: the inode, its kind, what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The inode.
    pub ino: Ino,
    /// Its kind.
    pub kind: Kind,
    /// What happened to it.
    pub what: What,
}

impl Event {
    /// Encoded size at most (a tag, a kind, a varint inode of up to 10
    /// bytes, and per link a varint directory and a name with its
    /// length): what the event adds to its group's change record, which
    /// must fit one value ([`RECORD_MAX`]), and to the group's journal
    /// estimate.
    pub(crate) fn bytes(&self) -> usize {
        const LINK: usize = 10 + 2;
        12 + match &self.what {
            What::Linked(l) | What::Unlinked(l) => LINK + l.1.len(),
            What::Moved(a, b) => 2 * LINK + a.1.len() + b.1.len(),
            What::Made | What::Data | What::Meta => 0,
        }
    }
}

/// A change record: when its group committed, and its events in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When the group was sealed.
    pub time: Time,
    /// The events of its operations, in order.
    pub events: Vec<Event>,
}

fn put_link(v: &mut Vec<u8>, l: &Link) {
    v.put_var(l.0);
    v.put_lenbytes(&l.1);
}

fn link(r: &mut Reader) -> Result<Link> {
    let dir = r.var()?;
    Ok((dir, r.lenbytes(255, "name")?.to_vec()))
}

impl Record {
    /// Encode: zvar sec, var nsec, var count, then per event a tag
    /// (1 made, 2 linked, 3 unlinked, 4 moved, 5 data, 6 metadata), the
    /// kind's code, var ino, and its links (var dir, var length, name).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(zigzag(self.time.sec));
        v.put_var(u64::from(self.time.nsec));
        v.put_var(self.events.len() as u64);
        for e in &self.events {
            let tag = match &e.what {
                What::Made => 1,
                What::Linked(_) => 2,
                What::Unlinked(_) => 3,
                What::Moved(..) => 4,
                What::Data => 5,
                What::Meta => 6,
            };
            v.put_u8(tag);
            v.put_u8(e.kind.code());
            v.put_var(e.ino);
            match &e.what {
                What::Linked(l) | What::Unlinked(l) => put_link(&mut v, l),
                What::Moved(a, b) => {
                    put_link(&mut v, a);
                    put_link(&mut v, b);
                }
                What::Made | What::Data | What::Meta => {}
            }
        }
        v
    }

    /// Decode; `what` names the record in errors.
    pub fn decode(b: &[u8], what: &str) -> Result<Record> {
        let mut r = Reader::new(b, what);
        let sec = unzigzag(r.var()?);
        let nsec = r.var_max(999_999_999, "nanoseconds")? as u32;
        let n = r.var_max(b.len() as u64, "event count")? as usize;
        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            let tag = r.u8()?;
            let c = r.u8()?;
            let kind = Kind::from_code(c).ok_or_else(|| r.err(format!("unknown file type {c}")))?;
            let ino = r.var()?;
            let what = match tag {
                1 => What::Made,
                2 => What::Linked(link(&mut r)?),
                3 => What::Unlinked(link(&mut r)?),
                4 => What::Moved(link(&mut r)?, link(&mut r)?),
                5 => What::Data,
                6 => What::Meta,
                t => return Err(r.err(format!("unknown change {t}")).into()),
            };
            events.push(Event { ino, kind, what });
        }
        r.finish()?;
        Ok(Record { time: Time { sec, nsec }, events })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let r = Record {
            time: Time { sec: 1_700_000_000, nsec: 5_000_000 },
            events: vec![
                Event { ino: 7, kind: Kind::File, what: What::Made },
                Event { ino: 7, kind: Kind::File, what: What::Data },
                Event { ino: 8, kind: Kind::Dir, what: What::Moved((1, b"d".to_vec()), (9, b"e".to_vec())) },
                Event { ino: 7, kind: Kind::File, what: What::Linked((9, b"b".to_vec())) },
                Event { ino: 7, kind: Kind::File, what: What::Unlinked((1, b"a".to_vec())) },
                Event { ino: 10, kind: Kind::Symlink, what: What::Meta },
            ],
        };
        let v = r.encode();
        assert_eq!(Record::decode(&v, "r").unwrap(), r);
        for n in 0..v.len() {
            assert!(Record::decode(&v[..n], "r").is_err(), "cut at {n}");
        }
        let mut bad = v.clone();
        bad[3] = 9; // the first event's tag
        assert!(Record::decode(&bad, "r").is_err());
    }
}
