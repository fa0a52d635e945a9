//! Namespace operations: lookups, making nodes, links, removal, rename,
//! directory listing. Each checks everything it can before it changes
//! anything, so that a refused operation leaves no trace.

use crate::error::{Error, Result};
use crate::event::What;
use crate::keys::*;
use crate::ops::acl;
use crate::state::State;
use crate::time::now;
use crate::{Attr, DirEntry, Fs, RENAME_EXCHANGE, RENAME_NOREPLACE};

/// Longest symlink target.
pub const MAX_SYMLINK: usize = 4095;

pub(crate) fn name_str(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

/// Check a name for a new directory entry.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::invalid(format!("invalid name {:?}", name_str(name))));
    }
    if name.len() > 255 {
        return Err(Error::name_too_long(format!("name of {} bytes exceeds 255", name.len())));
    }
    if name.iter().any(|&c| c == b'/' || c == 0) {
        return Err(Error::invalid(format!("name {:?} contains '/' or NUL", name_str(name))));
    }
    Ok(())
}

fn noent(what: impl std::fmt::Display) -> Error {
    Error::not_found(format!("{what} does not exist"))
}

impl State {
    pub(crate) fn entry(&self, parent: Ino, name: &[u8]) -> Result<(Ino, Kind)> {
        self.dir(parent)?;
        if name.len() > 255 {
            // No such name can exist; POSIX wants it said this way.
            return Err(Error::name_too_long(format!("name of {} bytes exceeds 255", name.len())));
        }
        self.lookup_entry(parent, name)?
            .ok_or_else(|| noent(format!("{:?} in directory {parent}", name_str(name))))
    }

    /// Create an entry. `umask` applies unless the directory has a default
    /// ACL, which the new entry inherits instead (POSIX.1e).
    fn make(
        &mut self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        ids: (u32, u32),
        rdev: u64,
    ) -> Result<Inode> {
        let (uid, gid) = ids;
        check_name(name)?;
        // An inode, a name, and the parent's inode again.
        self.pre_grow(name.len() + 256)?;
        let kind = Kind::from_mode(mode)
            .ok_or_else(|| Error::invalid(format!("mode {mode:o} names no file type")))?;
        let mut p = self.live_dir(parent)?;
        if self.lookup_entry(parent, name)?.is_some() {
            return Err(Error::exists(format!("{:?} exists in directory {parent}", name_str(name))));
        }
        if kind == Kind::Dir && p.nlink >= u32::MAX - 1 {
            return Err(Error::too_many_links(format!("directory {parent} has too many subdirectories")));
        }
        let default_acl =
            if kind == Kind::Symlink { None } else { self.get(&xattr_key(parent, acl::DEFAULT))? };
        let (mode, access_acl) = match default_acl.as_deref().and_then(acl::parse) {
            Some(d) => {
                let (a, perm, not_equiv) = acl::create(d, mode);
                ((mode & !0o777) | perm, not_equiv.then(|| acl::encode(&a)))
            }
            None => (mode & !(umask & 0o777), None),
        };
        let t = now();
        let ino = self.group.alloc_ino();
        if let Some(a) = access_acl {
            self.put(xattr_key(ino, acl::ACCESS), a);
        }
        if kind == Kind::Dir {
            if let Some(d) = default_acl {
                self.put(xattr_key(ino, acl::DEFAULT), d);
            }
        }
        let i = Inode {
            ino,
            mode,
            uid,
            gid,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            alloc: 0,
            rdev: if matches!(kind, Kind::Char | Kind::Block) { rdev } else { 0 },
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            parent,
            policy: p.policy,
            chunk: if matches!(kind, Kind::File | Kind::Dir) { p.chunk } else { None },
            tier: if matches!(kind, Kind::File | Kind::Dir) { p.tier } else { None },
            unit: if matches!(kind, Kind::File | Kind::Dir) { p.unit } else { None },
            cold: if matches!(kind, Kind::File | Kind::Dir) { p.cold } else { None },
        };
        self.save(&i);
        self.put(dirent_key(parent, name), encode_dirent(ino, kind));
        self.note(ino, kind, What::Made);
        if kind == Kind::Dir {
            p.nlink += 1;
        }
        p.mtime = t;
        p.ctime = t;
        self.save(&p);
        Ok(i)
    }

    /// One link fewer, the one in `dir`; deletes the inode when none is
    /// left and it is not open.
    fn drop_link(&mut self, mut i: Inode, dir: Ino) -> Result<()> {
        if i.parent == dir {
            // Which of the other links is first is not known without a
            // scan: the change feed names this file by its events only.
            i.parent = 0;
        }
        i.nlink = i.nlink.saturating_sub(1);
        i.ctime = now();
        if i.nlink > 0 {
            self.save(&i);
            return Ok(());
        }
        self.unlinked(i)
    }

    pub(crate) fn unlinked(&mut self, mut i: Inode) -> Result<()> {
        i.nlink = 0;
        if self.open.get(&i.ino).is_some_and(|&n| n > 0) {
            self.save(&i);
            self.put(orphan_key(i.ino), vec![0]);
            Ok(())
        } else {
            self.destroy(&mut i)
        }
    }

    fn is_empty_dir(&self, ino: Ino) -> Result<bool> {
        let (lo, hi) = dirents_range(ino);
        Ok(self.scan(&lo, &hi, 1)?.is_empty())
    }

    /// EINVAL when `dir` is `moved` or lies below it.
    fn check_not_below(&self, dir: Ino, moved: Ino) -> Result<()> {
        let mut cur = dir;
        for _ in 0..100_000 {
            if cur == moved {
                return Err(Error::invalid(format!(
                    "cannot move directory {moved} into itself or its own subdirectory {dir}"
                )));
            }
            if cur == ROOT {
                return Ok(());
            }
            cur = self.inode(cur)?.parent;
        }
        Err(Error::corrupt(format!("directory {dir}"), "its parents form a cycle"))
    }

    fn rename(&mut self, p: Ino, n: &[u8], np: Ino, nn: &[u8], flags: u32) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
            return Err(Error::invalid(format!("unsupported rename flags {flags:#x}")));
        }
        check_name(nn)?;
        let (sino, skind) = self.entry(p, n)?;
        self.live_dir(np)?;
        let dst = self.lookup_entry(np, nn)?;
        if flags & RENAME_EXCHANGE != 0 && dst.is_none() {
            return Err(noent(format!("{:?} in directory {np}", name_str(nn))));
        }
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Error::exists(format!("{:?} exists in directory {np}", name_str(nn))));
        }
        if p == np && n == nn {
            return Ok(());
        }
        if dst.is_some_and(|(d, _)| d == sino) {
            return Ok(()); // two links of one file: POSIX says do nothing
        }
        if skind == Kind::Dir && p != np {
            self.check_not_below(np, sino)?;
        }
        if let Some(d) = dst.filter(|_| flags & RENAME_EXCHANGE != 0) {
            return self.exchange(p, n, np, nn, (sino, skind), d);
        }
        let t = now();
        // Check the replaced entry before changing anything.
        let victim = match dst {
            Some((dino, dkind)) => {
                if skind == Kind::Dir && dkind != Kind::Dir {
                    return Err(Error::not_dir(format!("{:?} is not a directory", name_str(nn))));
                }
                if skind != Kind::Dir && dkind == Kind::Dir {
                    return Err(Error::is_dir(format!("{:?} is a directory", name_str(nn))));
                }
                if dkind == Kind::Dir && !self.is_empty_dir(dino)? {
                    return Err(Error::not_empty(format!("directory {:?} is not empty", name_str(nn))));
                }
                Some(self.inode(dino)?)
            }
            None => None,
        };
        self.del(dirent_key(p, n));
        self.put(dirent_key(np, nn), encode_dirent(sino, skind));
        if let Some(v) = &victim {
            self.note(v.ino, v.kind(), What::Unlinked((np, nn.to_vec())));
        }
        self.note(sino, skind, What::Moved((p, n.to_vec()), (np, nn.to_vec())));
        let mut s = self.inode(sino)?;
        s.ctime = t;
        if skind != Kind::Dir && s.parent == p {
            s.parent = np;
        }
        if skind == Kind::Dir && p != np {
            s.parent = np;
            let mut pi = self.inode(p)?;
            pi.nlink -= 1;
            self.save(&pi);
            let mut npi = self.inode(np)?;
            npi.nlink += 1;
            self.save(&npi);
        }
        self.save(&s);
        if let Some(v) = &victim {
            if v.kind() == Kind::Dir {
                let mut npi = self.inode(np)?;
                npi.nlink -= 1;
                self.save(&npi);
            }
        }
        self.touch_dirs(p, np, t)?;
        if let Some(v) = victim {
            if v.kind() == Kind::Dir {
                self.unlinked(v)?;
            } else {
                self.drop_link(v, np)?;
            }
        }
        Ok(())
    }

    /// RENAME_EXCHANGE: entries `n` of `p` and `nn` of `np` swap inodes
    /// (`src` and `dst`, with their kinds).
    fn exchange(
        &mut self,
        p: Ino,
        n: &[u8],
        np: Ino,
        nn: &[u8],
        src: (Ino, Kind),
        dst: (Ino, Kind),
    ) -> Result<()> {
        let ((sino, skind), (dino, dkind)) = (src, dst);
        let t = now();
        if dkind == Kind::Dir && p != np {
            self.check_not_below(p, dino)?;
        }
        self.put(dirent_key(p, n), encode_dirent(dino, dkind));
        self.put(dirent_key(np, nn), encode_dirent(sino, skind));
        self.note(sino, skind, What::Moved((p, n.to_vec()), (np, nn.to_vec())));
        self.note(dino, dkind, What::Moved((np, nn.to_vec()), (p, n.to_vec())));
        let mut s = self.inode(sino)?;
        let mut d = self.inode(dino)?;
        if p != np {
            let (sd, dd) = (skind == Kind::Dir, dkind == Kind::Dir);
            if sd || s.parent == p {
                s.parent = np;
            }
            if dd || d.parent == np {
                d.parent = p;
            }
            if sd != dd {
                let mut pi = self.inode(p)?;
                let mut npi = self.inode(np)?;
                if sd {
                    pi.nlink -= 1;
                    npi.nlink += 1;
                } else {
                    pi.nlink += 1;
                    npi.nlink -= 1;
                }
                self.save(&pi);
                self.save(&npi);
            }
        }
        s.ctime = t;
        d.ctime = t;
        self.save(&s);
        self.save(&d);
        self.touch_dirs(p, np, t)?;
        Ok(())
    }

    fn touch_dirs(&mut self, p: Ino, np: Ino, t: Time) -> Result<()> {
        for d in [p, np] {
            let mut i = self.inode(d)?;
            i.mtime = t;
            i.ctime = t;
            self.save(&i);
        }
        Ok(())
    }
}

impl Fs {
    /// The entry `name` of directory `parent`. "." is `parent` itself,
    /// whatever its kind: the kernel looks a node up by its id that way
    /// when a file handle outlives its caches (open_by_handle_at, NFS).
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        let st = self.st();
        if name == b"." {
            return Ok(st.attr(&st.inode(parent)?));
        }
        if name == b".." {
            let p = st.dir(parent)?;
            return Ok(st.attr(&st.inode(p.parent)?));
        }
        let (ino, _) = st.entry(parent, name)?;
        let i = st.inode(ino)?;
        Ok(st.attr(&i))
    }

    /// Create a node of any type; `mode` holds the type bits.
    pub fn mknod(&self, parent: Ino, name: &[u8], mode: u32, uid: u32, gid: u32, rdev: u64) -> Result<Attr> {
        self.mknod_umask(parent, name, mode, 0, (uid, gid), rdev)
    }

    /// [`Fs::mknod`] with the caller's umask, which applies unless the
    /// directory has a default ACL (then the entry inherits that instead).
    pub fn mknod_umask(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        (uid, gid): (u32, u32),
        rdev: u64,
    ) -> Result<Attr> {
        self.synced(self.mknod_umask_now(parent, name, mode, umask, (uid, gid), rdev), true)
    }

    fn mknod_umask_now(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        (uid, gid): (u32, u32),
        rdev: u64,
    ) -> Result<Attr> {
        let mut st = self.st();
        st.pre_op()?;
        if Kind::from_mode(mode) == Some(Kind::Symlink) {
            return Err(Error::invalid("use symlink to create symbolic links"));
        }
        let i = st.make(parent, name, mode, umask, (uid, gid), rdev)?;
        Ok(st.attr(&i))
    }

    /// Create a regular file.
    pub fn create(&self, parent: Ino, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, 0o100000 | (perm & 0o7777), uid, gid, 0)
    }

    /// Create a directory.
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, 0o040000 | (perm & 0o7777), uid, gid, 0)
    }

    /// Create a symbolic link to `target`.
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        self.synced(self.symlink_now(parent, name, target, uid, gid), true)
    }

    fn symlink_now(&self, parent: Ino, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        if target.is_empty() || target.len() > MAX_SYMLINK {
            let msg = format!("symlink target of {} bytes (1 to {MAX_SYMLINK} allowed)", target.len());
            return Err(if target.is_empty() { Error::not_found(msg) } else { Error::name_too_long(msg) });
        }
        let mut st = self.st();
        st.pre_op()?;
        let mut i = st.make(parent, name, 0o120777, 0, (uid, gid), 0)?;
        st.write_data(&mut i, 0, target)?;
        st.save(&i);
        st.debug_check_file(&i);
        Ok(st.attr(&i))
    }

    /// The target of a symbolic link.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let mut st = self.st();
        let i = st.inode(ino)?;
        if i.kind() != Kind::Symlink {
            return Err(Error::invalid(format!("inode {ino} is not a symbolic link")));
        }
        st.read_data(&i, 0, i.size as usize)
    }

    /// A new name for an existing inode.
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.synced(self.link_now(ino, newparent, newname), true)
    }

    fn link_now(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        let mut st = self.st();
        st.pre_op()?;
        check_name(newname)?;
        st.pre_grow(newname.len() + 128)?;
        let mut i = st.inode(ino)?;
        if i.kind() == Kind::Dir {
            return Err(Error::not_permitted(format!("inode {ino} is a directory: no hard links")));
        }
        if i.nlink == 0 {
            return Err(noent(format!("inode {ino} (unlinked)")));
        }
        if i.nlink >= 65_000 {
            return Err(Error::too_many_links(format!("inode {ino} has {} links", i.nlink)));
        }
        let mut p = st.live_dir(newparent)?;
        if st.lookup_entry(newparent, newname)?.is_some() {
            return Err(Error::exists(format!("{:?} exists in directory {newparent}", name_str(newname))));
        }
        let t = now();
        i.nlink += 1;
        i.ctime = t;
        if i.parent == 0 {
            i.parent = newparent;
        }
        st.save(&i);
        st.put(dirent_key(newparent, newname), encode_dirent(ino, i.kind()));
        st.note(ino, i.kind(), What::Linked((newparent, newname.to_vec())));
        p.mtime = t;
        p.ctime = t;
        st.save(&p);
        Ok(st.attr(&i))
    }

    /// Remove a name that is not a directory.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.synced(self.unlink_now(parent, name), true)
    }

    fn unlink_now(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let mut st = self.st();
        st.pre_relieve()?;
        let (ino, kind) = st.entry(parent, name)?;
        if kind == Kind::Dir {
            return Err(Error::is_dir(format!("{:?} is a directory", name_str(name))));
        }
        let i = st.inode(ino)?;
        st.del(dirent_key(parent, name));
        st.note(ino, kind, What::Unlinked((parent, name.to_vec())));
        let t = now();
        let mut p = st.inode(parent)?;
        p.mtime = t;
        p.ctime = t;
        st.save(&p);
        st.drop_link(i, parent)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.synced(self.rmdir_now(parent, name), true)
    }

    fn rmdir_now(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let mut st = self.st();
        st.pre_relieve()?;
        if name == b"." {
            return Err(Error::invalid("cannot remove \".\""));
        }
        if name == b".." {
            return Err(Error::not_empty("cannot remove \"..\""));
        }
        let (ino, kind) = st.entry(parent, name)?;
        if kind != Kind::Dir {
            return Err(Error::not_dir(format!("{:?} is not a directory", name_str(name))));
        }
        if !st.is_empty_dir(ino)? {
            return Err(Error::not_empty(format!("directory {:?} is not empty", name_str(name))));
        }
        let i = st.inode(ino)?;
        st.del(dirent_key(parent, name));
        st.note(ino, kind, What::Unlinked((parent, name.to_vec())));
        let t = now();
        let mut p = st.inode(parent)?;
        p.nlink -= 1;
        p.mtime = t;
        p.ctime = t;
        st.save(&p);
        st.unlinked(i)
    }

    /// Rename, with [`RENAME_NOREPLACE`] or [`RENAME_EXCHANGE`].
    pub fn rename(&self, parent: Ino, name: &[u8], newparent: Ino, newname: &[u8], flags: u32) -> Result<()> {
        self.synced(self.rename_now(parent, name, newparent, newname, flags), true)
    }

    fn rename_now(&self, parent: Ino, name: &[u8], newparent: Ino, newname: &[u8], flags: u32) -> Result<()> {
        let mut st = self.st();
        st.pre_relieve()?;
        st.rename(parent, name, newparent, newname, flags)
    }

    /// Entries of a directory in name order, after `after`, at most `limit`.
    /// Resuming after a name is stable while entries come and go.
    /// Reading from the start counts as an access of the directory (its
    /// atime, under the atime policy and `diratime`).
    pub fn readdir(&self, ino: Ino, after: Option<&[u8]>, limit: usize) -> Result<Vec<DirEntry>> {
        let mut st = self.st();
        let d = st.dir(ino)?;
        if after.is_none() {
            st.relatime(d);
        }
        let (lo, hi) = dirents_range(ino);
        let start = match after {
            Some(n) => {
                let mut k = dirent_key(ino, n);
                k.push(0);
                k
            }
            None => lo,
        };
        let mut out = Vec::new();
        for (k, v) in st.scan(&start, &hi, limit)? {
            let (_, name) = parse_dirent_key(&k)
                .ok_or_else(|| Error::corrupt("directory entry key", format!("{k:02x?}")))?;
            let (child, kind) = decode_dirent(&v)?;
            out.push(DirEntry { name: name.to_vec(), ino: child, kind });
        }
        Ok(out)
    }
}
