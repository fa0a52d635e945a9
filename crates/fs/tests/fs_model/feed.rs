//! The change feed against the model: what changed between two models,
//! by node (the model numbers nodes as the file system numbers inodes,
//! in creation order), and the check of a feed against it.

use std::collections::{BTreeMap, BTreeSet};

use zlogfs_fs::{ChangeFeed, ChangeOp};

use super::Model;

type Links = BTreeSet<(u64, Vec<u8>)>;

/// Every node's links.
fn links(m: &Model) -> BTreeMap<u64, Links> {
    let mut out: BTreeMap<u64, Links> = BTreeMap::new();
    for (&d, n) in &m.nodes {
        if let super::MKind::Dir(c) = &n.kind {
            for (name, &id) in c {
                out.entry(id).or_default().insert((d, name.clone()));
            }
        }
    }
    out
}

/// The path of entry `name` of directory `dir`.
fn path(m: &Model, l: &(u64, Vec<u8>)) -> Vec<u8> {
    let mut parts = vec![l.1.clone()];
    let mut d = l.0;
    while d != 1 {
        let p = m.nodes[&d].parent;
        let name = m.children(p).expect("dir").iter().find(|(_, &c)| c == d).expect("named").0;
        parts.push(name.clone());
        d = p;
    }
    parts.iter().rev().flat_map(|p| [b"/".as_slice(), p].concat()).collect()
}

/// What a feed says or the models want of one node.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    old: BTreeSet<Vec<u8>>,
    new: BTreeSet<Vec<u8>>,
    changed: bool,
    data: bool,
    meta: bool,
}

/// Check `feed` (from the point of `a` to that of `b`, read when the
/// tree was `now`) against the models' difference. Exact for nodes that
/// never had a second link up to `now`; for those that had, which of
/// several names the feed gives is free, or none (the file system only
/// knows the first directory of a file's links, and the feed names a
/// link at an earlier point from the present one and the events since),
/// so only that every path it gives is one of the node's is checked.
pub fn check(feed: &ChangeFeed, a: &Model, b: &Model, now: &Model, ctx: &str) {
    if let Err(e) = differences(feed, a, b, now) {
        panic!("{ctx}: {e}");
    }
}

/// Of the models in `history` that read as `m` does, the last whose
/// changes since each snapshot (`snaps`: model and point) are what
/// `f`'s change feed says: after a power cut, an operation that left the
/// tree as it was (a write of the same bytes, a chmod to the same mode)
/// may or may not have been kept, and only the feed tells.
pub fn settle(f: &zlogfs_fs::Fs, history: &[Model], m: Model, snaps: &[(String, Model, u64)]) -> Model {
    let dump = m.dump();
    let fits = |h: &Model| {
        snaps
            .iter()
            .all(|(_, a, seq)| f.changes(*seq, None).is_ok_and(|feed| differences(&feed, a, h, h).is_ok()))
    };
    history.iter().rev().find(|h| h.dump() == dump && h.next == m.next && fits(h)).cloned().unwrap_or(m)
}

/// Where `feed` and the models' difference disagree.
fn differences(feed: &ChangeFeed, a: &Model, b: &Model, now: &Model) -> Result<(), String> {
    ensure(!feed.fresh_instance, || "a fresh instance where the records are kept".into())?;
    let mut got: BTreeMap<u64, Seen> = BTreeMap::new();
    // Entries without a path (allowed for nodes that had a second link).
    let mut unnamed = BTreeSet::new();
    for c in &feed.changes {
        let s = got.entry(c.ino).or_default();
        let (p, old) = (c.path.clone(), c.old_path.clone());
        if p.is_none() || (c.op == ChangeOp::Renamed && old.is_none()) {
            unnamed.insert(c.ino);
        }
        match c.op {
            ChangeOp::Created => ensure(s.new.insert(p.unwrap_or_default()), || format!("twice: {c:?}"))?,
            ChangeOp::Deleted => ensure(s.old.insert(p.unwrap_or_default()), || format!("twice: {c:?}"))?,
            ChangeOp::Renamed => {
                s.new.extend(p);
                s.old.extend(old);
            }
            ChangeOp::Changed => s.changed = true,
        }
        if matches!(c.op, ChangeOp::Renamed | ChangeOp::Changed) {
            s.data |= c.data;
            s.meta |= c.metadata;
        }
    }
    let (la, lb) = (links(a), links(b));
    let ids: BTreeSet<u64> = la.keys().chain(lb.keys()).copied().collect();
    for id in ids {
        let (sa, sb) = (la.get(&id).cloned().unwrap_or_default(), lb.get(&id).cloned().unwrap_or_default());
        let (ea, eb) = (!sa.is_empty(), !sb.is_empty());
        let gone: Vec<_> = sa.iter().filter(|l| !eb || !sb.contains(*l)).collect();
        let new: Vec<_> = sb.iter().filter(|l| !ea || !sa.contains(*l)).collect();
        let (na, nb) = (a.nodes.get(&id), b.nodes.get(&id));
        let (data, meta) = match (na, nb) {
            (Some(x), Some(y)) => (x.dv != y.dv, x.mv != y.mv),
            _ => (false, false),
        };
        let kept = sa.intersection(&sb).next().is_some();
        let want = Seen {
            old: gone.iter().map(|l| path(a, l)).collect(),
            new: new.iter().map(|l| path(b, l)).collect(),
            changed: (data || meta) && kept,
            data: (data && (kept || (!gone.is_empty() && !new.is_empty()))),
            meta: (meta && (kept || (!gone.is_empty() && !new.is_empty()))),
        };
        let s = got.remove(&id).unwrap_or_default();
        let shared = [na, nb, now.nodes.get(&id)].into_iter().flatten().any(|n| n.shared);
        if !shared {
            ensure(!unnamed.contains(&id), || {
                let mine: Vec<_> = feed.changes.iter().filter(|c| c.ino == id).collect();
                format!("node {id} has no path: {s:?}; the feed's entries {mine:?}; links then {sa:?}, now {sb:?}")
            })?;
            ensure(s == want, || format!("node {id}: the feed says {s:?}, the models {want:?}"))?;
            continue;
        }
        let mut all_a: BTreeSet<_> = sa.iter().map(|l| path(a, l)).collect();
        let mut all_b: BTreeSet<_> = sb.iter().map(|l| path(b, l)).collect();
        all_a.insert(Vec::new());
        all_b.insert(Vec::new());
        ensure(s.old.is_subset(&all_a) && s.new.is_subset(&all_b), || {
            format!("node {id}: {s:?}, but its paths were {all_a:?} then {all_b:?}")
        })?;
        ensure(ea == eb || s != Seen::default(), || format!("node {id} came or went unseen"))?;
    }
    ensure(got.is_empty(), || format!("the feed lists nodes the models do not: {got:?}"))
}

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}
