//! The tree: reaching every inode from the root, directory entries,
//! link counts, orphans and xattrs.

use super::*;
use crate::error::Result;
use crate::ops::namespace::{check_name, name_str};

impl<'a> Checker<'a> {
    /// Which directories are reachable from the root, through the entries
    /// that name directories.
    pub(super) fn reach(&mut self) -> Result<()> {
        let mut edges: Vec<(Ino, Ino)> = Vec::new();
        let (st, (lo, hi)) = (self.st, all_dirents_range());
        st.for_each(&lo, &hi, |k, v| {
            if let (Some((parent, _)), Ok((child, _))) = (parse_dirent_key(k), decode_dirent(v)) {
                if self.is_dir(child) {
                    edges.push((parent, child));
                }
            }
            Ok(()) // the rest is said by the span passes
        })?;
        edges.sort_unstable();
        self.reached = vec![false; self.dirs.len()];
        // From the root's entries even when its inode is damaged (said by
        // the survey), as the single pass did.
        let mut queue = vec![ROOT];
        if let Ok(r) = self.dirs.binary_search(&ROOT) {
            self.reached[r] = true;
        }
        while let Some(d) = queue.pop() {
            let start = edges.partition_point(|e| e.0 < d);
            for &(_, c) in edges[start..].iter().take_while(|e| e.0 == d) {
                let i = self.dirs.binary_search(&c).expect("edges name directories");
                if !self.reached[i] {
                    self.reached[i] = true;
                    queue.push(c);
                }
            }
        }
        Ok(())
    }

    /// Every check of the inodes in `span` (`count` of them): their
    /// entries, links, chunks and xattrs. `kept`: the survey's table is
    /// this span's.
    pub(super) fn inode_span(
        &mut self,
        span: Span<Ino>,
        count: usize,
        first: bool,
        kept: bool,
    ) -> Result<()> {
        (self.span, self.first) = (span, first);
        if !kept {
            self.load_nodes(count)?;
        }
        if let Some(r) = self.node_mut(ROOT) {
            r.flags |= REACHABLE;
        }
        self.orphans()?;
        self.dirents()?;
        self.links();
        self.chunks()?;
        self.xattrs()?;
        self.nodes = Vec::new();
        Ok(())
    }

    /// The table of the span's inodes (the survey said what is wrong with
    /// them).
    pub(super) fn load_nodes(&mut self, count: usize) -> Result<()> {
        let st = self.st;
        let base = st.group.cfg().base_sec;
        self.nodes = Vec::with_capacity(count);
        let (lo, hi) = ino_span(ByIno::Inodes, self.span.0, self.span.1);
        st.for_each(&lo, &hi, |k, v| {
            if let Some(ino) = parse_inode_key(k) {
                if let Ok(i) = Inode::decode(ino, v, base, |id| st.group.triple(id)) {
                    self.nodes.push(Node::of(ino, &i));
                }
            }
            Ok(())
        })?;
        if !self.nodes.is_sorted_by_key(|n| n.ino) {
            self.nodes.sort_unstable_by_key(|n| n.ino);
        }
        Ok(())
    }

    pub(super) fn orphans(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, ino_span(ByIno::Orphans, self.span.0, self.span.1));
        st.for_each(&lo, &hi, |k, _| {
            if let Some(i) = parse_orphan_key(k) {
                self.rep.orphans += 1;
                if let Some(n) = self.node_mut(i) {
                    n.flags |= ORPHAN;
                }
            }
            Ok(())
        })
    }

    /// Directory entries: valid names in directories, naming inodes of
    /// their kind; a subdirectory names its directory as its parent. Each
    /// pass reads every entry: those in the span's directories and those
    /// naming the span's inodes count.
    pub(super) fn dirents(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, all_dirents_range());
        st.for_each(&lo, &hi, |k, v| {
            match parse_dirent_key(k) {
                Some((parent, name)) => self.dirent(parent, name, v),
                None if self.first => {
                    self.rep.dirents += 1;
                    self.bad(format!("malformed directory entry key {k:02x?}"));
                }
                None => {}
            }
            Ok(())
        })
    }

    pub(super) fn dirent(&mut self, parent: Ino, name: &[u8], v: &[u8]) {
        let mine = in_span(parent, self.span);
        let nm = || name_str(name);
        if mine {
            self.rep.dirents += 1;
            if let Err(e) = check_name(name) {
                self.bad(format!("directory {parent}: entry {:?}: {e}", nm()));
            }
            if !self.node(parent).is_some_and(|p| p.kind == Kind::Dir) {
                self.bad(format!("entry {:?} lies in {parent}, which is not a directory", nm()));
            }
        }
        let (child, kind) = match decode_dirent(v) {
            Ok(x) => x,
            Err(e) if mine => return self.bad(format!("directory {parent}: entry {:?}: {e}", nm())),
            Err(_) => return,
        };
        if mine && self.is_dir(child) {
            if let Some(p) = self.node_mut(parent) {
                p.subdirs += 1;
            }
        }
        if !in_span(child, self.span) {
            return;
        }
        let reached = self.reachable_dir(parent);
        match self.node(child).map(|c| (c.kind, c.parent)) {
            None => self.bad(format!("directory {parent}: entry {:?} points at missing inode {child}", nm())),
            Some((ck, cparent)) => {
                if ck != kind {
                    self.bad(format!(
                        "directory {parent}: entry {:?} says {kind:?}, inode {child} is {ck:?}",
                        nm()
                    ));
                }
                if ck == Kind::Dir && cparent != parent {
                    self.bad(format!("directory {child} is in {parent} but names {cparent} as its parent"));
                }
                let c = self.node_mut(child).expect("looked up above");
                c.entries += 1;
                if c.parent == parent {
                    c.flags |= PARENT_ENTRY;
                }
                if reached {
                    c.flags |= REACHABLE;
                }
            }
        }
    }

    /// Link counts match the entries, directories have one name, files
    /// are listed by the directory they name, and every inode not waiting
    /// as an orphan is reachable from the root.
    pub(super) fn links(&mut self) {
        for i in 0..self.nodes.len() {
            let Node { ino, kind, nlink, entries: n, subdirs, parent, flags, .. } = self.nodes[i];
            let orphan = flags & ORPHAN != 0;
            if kind == Kind::Dir {
                let want = 2 + subdirs;
                if nlink != want && !(orphan && nlink == 0) {
                    self.bad(format!("directory {ino} has link count {nlink}, its entries make {want}"));
                }
                if ino != ROOT && n > 1 {
                    self.bad(format!("directory {ino} has {n} names"));
                }
            } else if nlink != n {
                self.bad(format!("inode {ino} has link count {nlink}, but {n} entries name it"));
            }
            // A file's parent, when known, holds a link to it (the change
            // feed names files by it).
            if kind != Kind::Dir && parent != 0 && !orphan && flags & PARENT_ENTRY == 0 {
                self.bad(format!(
                    "inode {ino} names directory {parent} as its parent, which has no entry for it"
                ));
            }
            if flags & REACHABLE == 0 && !orphan {
                self.bad(format!("inode {ino} ({kind:?}) is not reachable from the root"));
            }
        }
    }

    /// Every xattr of the span belongs to an inode.
    pub(super) fn xattrs(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, ino_span(ByIno::Xattrs, self.span.0, self.span.1));
        st.for_each(&lo, &hi, |k, _| {
            self.rep.xattrs += 1;
            match parse_xattr_key(k) {
                Some((ino, _)) if self.node(ino).is_some() => {}
                Some((ino, n)) => self.bad(format!("xattr {:?} belongs to missing inode {ino}", name_str(n))),
                None => self.bad(format!("malformed xattr key {k:02x?}")),
            }
            Ok(())
        })
    }
}
