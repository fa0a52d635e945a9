//! Directory listings for readdir with stateless offsets.
//!
//! A FUSE readdir names its position by a 64-bit offset, the one the
//! previous reply gave its last entry. The offset of an entry here is a
//! 63-bit hash of its name, and a directory is listed in hash order (as
//! ext4's hashed directories are): resuming at offset `h` returns the
//! entries whose hash is above `h`. So an offset means the same thing
//! whatever was created or removed since, and every entry that exists
//! throughout a listing is returned exactly once, without any state kept
//! per open directory. That lets the kernel skip OPENDIR and RELEASEDIR
//! (two of the four requests a cold `find` costs per directory) and cache
//! listings itself.
//!
//! The one loss: two names of one directory with the same 63-bit hash, the
//! second cut off by the end of a reply, would make the second skipped.
//! Among a million names the chance of any equal pair is about 5 in 10^8.
//!
//! A listing is built from the index in name order and sorted by hash;
//! [`Listings`] keeps recent ones so that a directory read a page at a time
//! is loaded once. The mount drops a directory's listing whenever an
//! operation changes its entries.

use std::collections::{HashMap, VecDeque};
use std::hash::Hasher;
use std::sync::{Arc, Mutex};

use zlogfs_fs::{DirEntry, Ino, Kind};

/// Offset of the entry ".".
pub const DOT: u64 = 1;
/// Offset of the entry "..".
pub const DOTDOT: u64 = 2;
/// The smallest offset of a named entry.
const FIRST: u64 = 3;

/// The readdir offset of `name`: a 63-bit hash, at least [`FIRST`].
pub fn offset_of(name: &[u8]) -> u64 {
    // SipHash-1-3 with fixed keys: offsets only need to be stable for the
    // life of a mount, and must not be steerable into long collision
    // chains by names alone any more than a good 64-bit hash allows.
    let mut h = std::hash::DefaultHasher::new();
    h.write(name);
    (h.finish() >> 1).max(FIRST)
}

/// One listed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its readdir offset ([`offset_of`] its name).
    pub off: u64,
    /// Name.
    pub name: Vec<u8>,
    /// Inode.
    pub ino: Ino,
    /// Kind.
    pub kind: Kind,
}

/// A directory's entries in readdir order (".", ".." not included).
#[derive(Debug, Default)]
pub struct Listing {
    entries: Vec<Listed>,
    bytes: usize,
}

impl Listing {
    /// The listing of `entries`.
    pub fn new(entries: impl IntoIterator<Item = DirEntry>) -> Listing {
        let mut v: Vec<Listed> = entries
            .into_iter()
            .map(|e| Listed { off: offset_of(&e.name), name: e.name, ino: e.ino, kind: e.kind })
            .collect();
        v.sort_unstable_by(|a, b| a.off.cmp(&b.off).then_with(|| a.name.cmp(&b.name)));
        let bytes = v.iter().map(|e| e.name.len() + std::mem::size_of::<Listed>()).sum();
        Listing { entries: v, bytes }
    }

    /// The entries that follow offset `off` (all of them below [`FIRST`]).
    pub fn after(&self, off: u64) -> &[Listed] {
        let i = self.entries.partition_point(|e| e.off <= off);
        &self.entries[i..]
    }

    /// Entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

struct Cached {
    /// Listings, each with the serial number of its insertion.
    map: HashMap<Ino, (u64, Arc<Listing>)>,
    /// Insertions, oldest first; an entry whose serial no longer matches
    /// the map's is stale and skipped (so a change costs no search here).
    order: VecDeque<(Ino, u64)>,
    serial: u64,
    bytes: usize,
    /// Directories whose listing is being loaded: loaders, and whether the
    /// directory changed since the first of them started (its listing may
    /// then be stale and is not kept).
    loading: HashMap<Ino, (usize, bool)>,
}

impl Cached {
    fn remove(&mut self, dir: Ino) {
        if let Some((_, old)) = self.map.remove(&dir) {
            self.bytes -= old.bytes;
        }
    }

    fn insert(&mut self, dir: Ino, l: Arc<Listing>, limit: usize) {
        self.remove(dir);
        self.serial += 1;
        self.bytes += l.bytes;
        self.map.insert(dir, (self.serial, l));
        self.order.push_back((dir, self.serial));
        // The newest stays, even alone past the limit: a directory too
        // large for the cache was loaded whole again for every reply of a
        // listing of it (issue 45: 1,374 µs an entry at a million).
        while self.bytes > limit && self.map.len() > 1 {
            let Some((o, n)) = self.order.pop_front() else { break };
            if self.map.get(&o).is_some_and(|e| e.0 == n) {
                self.remove(o);
            }
        }
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order.retain(|(d, n)| map.get(d).is_some_and(|e| e.0 == *n));
        }
    }
}

/// Recently built listings, bounded in bytes, oldest dropped first; the
/// newest is kept whatever its size, until the next one is built.
pub struct Listings {
    c: Mutex<Cached>,
    limit: usize,
}

impl Listings {
    /// A cache of about `limit` bytes of listings.
    pub fn new(limit: usize) -> Listings {
        let c = Cached {
            map: HashMap::new(),
            order: VecDeque::new(),
            serial: 0,
            bytes: 0,
            loading: HashMap::new(),
        };
        Listings { c: Mutex::new(c), limit }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.c.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The listing of directory `dir`, from the cache or built by `load`
    /// (which returns all its entries).
    pub fn get<E>(
        &self,
        dir: Ino,
        load: impl FnOnce() -> Result<Vec<DirEntry>, E>,
    ) -> Result<Arc<Listing>, E> {
        {
            let mut c = self.lock();
            if let Some((_, l)) = c.map.get(&dir) {
                return Ok(l.clone());
            }
            c.loading.entry(dir).or_insert((0, false)).0 += 1;
        }
        let loaded = load().map(|v| Arc::new(Listing::new(v)));
        let mut c = self.lock();
        let changed = match c.loading.get_mut(&dir) {
            Some(e) => {
                e.0 -= 1;
                let changed = e.1;
                if e.0 == 0 {
                    c.loading.remove(&dir);
                }
                changed
            }
            None => true,
        };
        let l = loaded?;
        if !changed {
            c.insert(dir, l.clone(), self.limit);
        }
        Ok(l)
    }

    /// Every directory may have changed: forget every listing.
    pub fn clear(&self) {
        let mut c = self.lock();
        c.map.clear();
        c.order.clear();
        c.bytes = 0;
        for e in c.loading.values_mut() {
            e.1 = true;
        }
    }

    /// The entries of `dir` change (or may have): forget its listing.
    /// Call after the change is made and before it is acknowledged.
    pub fn changed(&self, dir: Ino) {
        let mut c = self.lock();
        c.remove(dir);
        if let Some(e) = c.loading.get_mut(&dir) {
            e.1 = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    fn ent(name: &str, ino: Ino) -> DirEntry {
        DirEntry { name: name.as_bytes().to_vec(), ino, kind: Kind::File }
    }

    #[test]
    fn offsets_are_above_dots_and_in_order() {
        let l = Listing::new((0..1000).map(|i| ent(&format!("f{i}"), i + 10)));
        assert_eq!(l.len(), 1000);
        assert!(l.after(0).iter().all(|e| e.off >= FIRST && e.off <= i64::MAX as u64));
        assert!(l.after(0).windows(2).all(|w| w[0].off < w[1].off));
        assert_eq!(l.after(DOTDOT).len(), 1000);
        let mid = l.after(0)[499].off;
        assert_eq!(l.after(mid).len(), 500);
        assert!(l.after(u64::MAX >> 1).is_empty());
    }

    /// A listing read a page at a time while names come and go returns
    /// every name that exists throughout exactly once, and nothing that
    /// never existed.
    #[test]
    fn resumed_listing_under_changes_is_exact() {
        let seed: u64 =
            std::env::var("DIRLIST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
        println!("dirlist seed {seed} (replay with DIRLIST_SEED={seed})");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cache = Listings::new(1 << 20);
        for round in 0..50 {
            let dir = 7;
            let mut names: BTreeMap<String, Ino> =
                (0..rng.gen_range(0..400)).map(|i| (format!("n{round}-{i}"), i as Ino + 100)).collect();
            cache.changed(dir);
            let initial: Vec<String> = names.keys().cloned().collect();
            let mut ever: std::collections::HashSet<String> = names.keys().cloned().collect();
            let mut removed = std::collections::HashSet::new();
            let mut seen: Vec<String> = Vec::new();
            let mut off = 0;
            let mut serial = 0;
            loop {
                let snapshot: Vec<DirEntry> = names.iter().map(|(n, &i)| ent(n, i)).collect();
                let l = cache.get(dir, || Ok::<_, ()>(snapshot)).unwrap();
                let page = rng.gen_range(1..40);
                let got: Vec<Listed> = l.after(off).iter().take(page).cloned().collect();
                if got.is_empty() {
                    break;
                }
                off = got.last().unwrap().off;
                seen.extend(got.into_iter().map(|e| String::from_utf8(e.name).unwrap()));
                // Change the directory between pages.
                for _ in 0..rng.gen_range(0..5) {
                    if rng.gen_bool(0.5) || names.is_empty() {
                        serial += 1;
                        let n = format!("new{round}-{serial}");
                        ever.insert(n.clone());
                        names.insert(n, 5000 + serial);
                    } else {
                        let k = names.keys().nth(rng.gen_range(0..names.len())).unwrap().clone();
                        names.remove(&k);
                        removed.insert(k);
                    }
                    cache.changed(dir);
                }
            }
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for n in &seen {
                *counts.entry(n).or_default() += 1;
            }
            for (n, c) in &counts {
                assert_eq!(*c, 1, "seed {seed}: {n} listed {c} times");
                assert!(ever.contains(*n), "seed {seed}: {n} never existed");
            }
            for n in initial.iter().filter(|n| !removed.contains(*n)) {
                assert!(
                    counts.contains_key(n.as_str()),
                    "seed {seed}: {n} existed throughout but was not listed"
                );
            }
        }
    }

    #[test]
    fn cache_drops_changed_and_stale_listings() {
        let c = Listings::new(1 << 20);
        let l1 = c.get(1, || Ok::<_, ()>(vec![ent("a", 2)])).unwrap();
        // Served from the cache: the loader is not called.
        let l2 = c.get(1, || -> Result<Vec<DirEntry>, ()> { panic!("loaded twice") }).unwrap();
        assert!(Arc::ptr_eq(&l1, &l2));
        c.changed(1);
        let l3 = c.get(1, || Ok::<_, ()>(vec![ent("a", 2), ent("b", 3)])).unwrap();
        assert_eq!(l3.len(), 2);
        // A change while a listing loads: the loaded listing is used once
        // but not kept.
        let l4 = c
            .get(9, || {
                c.changed(9);
                Ok::<_, ()>(vec![ent("x", 4)])
            })
            .unwrap();
        assert_eq!(l4.len(), 1);
        let l5 = c.get(9, || Ok::<_, ()>(vec![])).unwrap();
        assert!(l5.is_empty());
        // A change to another directory does not stop a listing from
        // being kept.
        c.get(5, || {
            c.changed(6);
            Ok::<_, ()>(vec![ent("y", 7)])
        })
        .unwrap();
        let kept = c.get(5, || -> Result<Vec<DirEntry>, ()> { panic!("not kept") }).unwrap();
        assert_eq!(kept.len(), 1);
        // The byte bound evicts the oldest.
        let small = Listings::new(4 * (std::mem::size_of::<Listed>() + 8));
        small.get(1, || Ok::<_, ()>(vec![ent("a", 2), ent("b", 3)])).unwrap();
        small.get(2, || Ok::<_, ()>(vec![ent("c", 4), ent("d", 5)])).unwrap();
        small.get(3, || Ok::<_, ()>(vec![ent("e", 6)])).unwrap();
        let reloaded = small.get(1, || Ok::<_, ()>(vec![])).unwrap();
        assert!(reloaded.is_empty(), "the oldest listing should have been evicted");
    }

    /// A listing larger than the whole cache is kept while it is the
    /// newest (read a page at a time, it was loaded again for every page),
    /// and goes when another is built.
    #[test]
    fn a_listing_larger_than_the_cache_is_loaded_once() {
        let small = Listings::new(2 * (std::mem::size_of::<Listed>() + 8));
        let big: Vec<DirEntry> = (0..100).map(|i| ent(&format!("f{i}"), i + 10)).collect();
        let l1 = small.get(1, || Ok::<_, ()>(big.clone())).unwrap();
        for _ in 0..3 {
            let l = small.get(1, || -> Result<Vec<DirEntry>, ()> { panic!("loaded again") }).unwrap();
            assert!(Arc::ptr_eq(&l1, &l));
        }
        small.get(2, || Ok::<_, ()>(vec![ent("a", 2)])).unwrap();
        let again = small.get(1, || Ok::<_, ()>(vec![])).unwrap();
        assert!(again.is_empty(), "the big listing goes when another is built");
        small.get(2, || -> Result<Vec<DirEntry>, ()> { panic!("the small one was evicted") }).unwrap();
    }
}
