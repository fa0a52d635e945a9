//! The operations of [`Fs`]: namespace, attributes, data, xattrs.
//!
//! Each operation checks everything it can before it changes anything, so
//! that a refused operation leaves no trace; the mutations of one operation
//! land in the same commit group (long deletes excepted, which commit in
//! steps under an orphan record).

use super::*;

/// Largest file size (a chunk index must fit the key, and sizes fit i64).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Longest symlink target.
pub const MAX_SYMLINK: usize = 4095;

fn noent(what: impl std::fmt::Display) -> Error {
    Error::not_found(format!("{what} does not exist"))
}

impl State {
    fn entry(&self, parent: Ino, name: &[u8]) -> Result<(Ino, Kind)> {
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
        let ino = self.alloc_ino();
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
            parent: if kind == Kind::Dir { parent } else { 0 },
            policy: p.policy,
        };
        self.save(&i);
        self.put(dirent_key(parent, name), encode_dirent(ino, kind));
        if kind == Kind::Dir {
            p.nlink += 1;
        }
        p.mtime = t;
        p.ctime = t;
        self.save(&p);
        Ok(i)
    }

    /// One link fewer; deletes the inode when none is left and it is not
    /// open.
    fn drop_link(&mut self, mut i: Inode) -> Result<()> {
        i.nlink = i.nlink.saturating_sub(1);
        i.ctime = now();
        if i.nlink > 0 {
            self.save(&i);
            return Ok(());
        }
        self.unlinked(i)
    }

    fn unlinked(&mut self, mut i: Inode) -> Result<()> {
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
        let t = now();
        if flags & RENAME_EXCHANGE != 0 {
            let (dino, dkind) = dst.expect("checked");
            if dkind == Kind::Dir && p != np {
                self.check_not_below(p, dino)?;
            }
            self.put(dirent_key(p, n), encode_dirent(dino, dkind));
            self.put(dirent_key(np, nn), encode_dirent(sino, skind));
            let mut s = self.inode(sino)?;
            let mut d = self.inode(dino)?;
            if p != np {
                let (sd, dd) = (skind == Kind::Dir, dkind == Kind::Dir);
                if sd {
                    s.parent = np;
                }
                if dd {
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
            return Ok(());
        }
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
        let mut s = self.inode(sino)?;
        s.ctime = t;
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
                self.drop_link(v)?;
            }
        }
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

    fn file(&self, ino: Ino) -> Result<Inode> {
        let i = self.inode(ino)?;
        match i.kind() {
            Kind::File => Ok(i),
            Kind::Dir => Err(Error::is_dir(format!("inode {ino} is a directory"))),
            _ => Err(Error::invalid(format!("inode {ino} is not a regular file"))),
        }
    }

    /// A read of `i`: update its atime as the policy says.
    ///
    /// An atime update is the one change a read makes, and it must never
    /// cost a change the user asked for: a group of them is committed
    /// when it reaches the group's bound (reads add no other records, so
    /// nothing else would), and an update is dropped when that commit
    /// fails or when the log has no room for more than the reserve, which
    /// deletes need (docs/SEMANTICS.md, atime). Before, 27,000 reads of a
    /// full image made one group too large for the journal, and every
    /// later change failed with it.
    fn relatime(&mut self, mut i: Inode) {
        let t = now();
        let due = match self.atime {
            Atime::Noatime => false,
            Atime::Strict => true,
            Atime::Relatime => i.atime <= i.mtime || i.atime <= i.ctime || t.sec - i.atime.sec >= 86_400,
        };
        if !due || (!self.diratime && i.kind() == Kind::Dir) {
            return;
        }
        if self.pend.bytes + self.dirty_chunks * 64 > self.max_group / 2 {
            if let Err(e) = self.commit() {
                // The operation that needs the commit meets this again.
                self.note_dropped_atime(&e);
                return;
            }
        }
        // Room for the group's journal record after this one.
        if (self.pend.bytes + 64) as u64 > self.space_hint.saturating_sub(self.dirty_bytes as u64) {
            self.stats.atime_dropped += 1;
            return;
        }
        i.atime = t;
        self.save(&i);
        self.grew = true;
    }

    fn note_dropped_atime(&mut self, e: &Error) {
        if self.stats.atime_dropped == 0 {
            eprintln!("zlogfs: atime updates are dropped while a commit fails: {e}");
        }
        self.stats.atime_dropped += 1;
    }

    fn xattr_limit(&self) -> usize {
        (self.max_group / 8).min(zlogfs_engine::MAX_VALUE)
    }
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::out_of_range(format!("xattr name of {} bytes (1 to 255 allowed)", name.len())));
    }
    let ok = [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default";
    if !ok {
        return Err(Error::not_supported(format!(
            "xattr {:?} is outside the user., trusted., security. namespaces and POSIX ACLs",
            name_str(name)
        )));
    }
    Ok(())
}

impl Fs {
    /// Attributes of an inode.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let st = self.st();
        let i = st.inode(ino)?;
        Ok(st.attr(&i))
    }

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
        st.save(&i);
        st.put(dirent_key(newparent, newname), encode_dirent(ino, i.kind()));
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
        let t = now();
        let mut p = st.inode(parent)?;
        p.mtime = t;
        p.ctime = t;
        st.save(&p);
        st.drop_link(i)
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

    /// Note an open handle: an inode unlinked while open lives until the
    /// last handle is released.
    pub fn open_file(&self, ino: Ino) -> Result<Attr> {
        let mut st = self.st();
        let i = st.inode(ino)?;
        *st.open.entry(ino).or_insert(0) += 1;
        Ok(st.attr(&i))
    }

    /// Drop an open handle.
    pub fn release_file(&self, ino: Ino) -> Result<()> {
        let mut st = self.st();
        let left = match st.open.get_mut(&ino) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => return Ok(()),
        };
        if left == 0 {
            st.open.remove(&ino);
            if let Ok(mut i) = st.inode(ino) {
                // (Read-only: an orphan stays, and the next writer's open
                // finishes it.)
                if i.nlink == 0 && !st.read_only {
                    st.pre_relieve()?;
                    st.destroy(&mut i)?;
                }
            }
        }
        Ok(())
    }

    /// Read up to `len` bytes at `off`.
    ///
    /// The blocks the read needs that are not cached are read and
    /// decompressed first, without the lock, so that reads of several
    /// threads decompress on several cores; they are cached only if
    /// nothing placed or freed a block meanwhile (the log epoch did not
    /// move), since only then are they still what those addresses hold.
    /// The read itself then runs under the lock as before, finding them
    /// cached (or, evicted since, reading them again). A read that needs
    /// nothing uncached takes the lock once.
    pub fn read(&self, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut st = self.st();
        let mut i = st.file(ino)?;
        let need = st.uncached_blocks(&i, off, len)?;
        if !need.is_empty() {
            let epoch = st.epoch;
            drop(st);
            let got: Vec<(BlockAddr, Vec<u8>)> =
                need.into_iter().filter_map(|a| self.eng.read_block(a).ok().map(|b| (a, b))).collect();
            st = self.st();
            if st.epoch == epoch {
                for (a, b) in got {
                    st.cache.insert(a, Arc::new(b));
                }
            }
            // Changed or removed while the lock was not held.
            i = st.file(ino)?;
        }
        let v = st.read_data(&i, off, len)?;
        st.relatime(i);
        Ok(v)
    }

    /// Write `data` at `off`.
    pub fn write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.synced(self.write_now(ino, off, data, None), false)
    }

    /// [`Fs::write`] by `by`, which clears set-ID bits as [`Caller`] says.
    pub fn write_by(&self, ino: Ino, off: u64, data: &[u8], by: &Caller) -> Result<usize> {
        self.synced(self.write_now(ino, off, data, Some(by)), false)
    }

    fn write_now(&self, ino: Ino, off: u64, data: &[u8], by: Option<&Caller>) -> Result<usize> {
        let mut st = self.st();
        st.pre_op()?;
        let mut i = st.file(ino)?;
        if off.checked_add(data.len() as u64).is_none_or(|e| e > MAX_FILE_SIZE) {
            return Err(Error::file_too_big(format!(
                "write at {off} of {} bytes passes the largest file size",
                data.len()
            )));
        }
        let fresh = st.fresh_bytes(ino, off, data.len())?;
        st.pre_write(fresh)?;
        st.write_data(&mut i, off, data)?;
        let t = now();
        i.mtime = t;
        i.ctime = t;
        if let Some(c) = by {
            i.mode &= !c.cleared_by_write(i.mode, i.gid);
        }
        st.save(&i);
        Ok(data.len())
    }

    /// Change attributes; a size change truncates or extends.
    pub fn setattr(&self, ino: Ino, a: &SetAttr) -> Result<Attr> {
        self.synced(self.setattr_now(ino, a), false)
    }

    fn setattr_now(&self, ino: Ino, a: &SetAttr) -> Result<Attr> {
        let mut st = self.st();
        if a.size.is_some() && a.mode.is_none() && a.uid.is_none() && a.gid.is_none() {
            // A truncate: a removal, even upwards (a hole stores nothing).
            st.pre_relieve()?;
        } else {
            st.pre_op()?;
        }
        let mut i = st.inode(ino)?;
        let (mode0, gid0) = (i.mode, i.gid);
        let t = now();
        if let Some(size) = a.size {
            match i.kind() {
                Kind::File => {}
                Kind::Dir => return Err(Error::is_dir(format!("inode {ino} is a directory"))),
                _ => return Err(Error::invalid(format!("inode {ino} is not a regular file"))),
            }
            if size > MAX_FILE_SIZE {
                return Err(Error::file_too_big(format!("size {size} passes the largest file size")));
            }
            if size != i.size {
                st.set_len(&mut i, size)?;
                i.mtime = t;
            }
        }
        if let Some(m) = a.mode {
            i.mode = (i.mode & S_IFMT) | (m & 0o7777);
            let k = xattr_key(ino, acl::ACCESS);
            if let Some(mut entries) = st.get(&k)?.as_deref().and_then(acl::parse) {
                acl::chmod(&mut entries, m);
                st.put(k, acl::encode(&entries));
            }
        }
        if let Some(u) = a.uid {
            i.uid = u;
        }
        if let Some(g) = a.gid {
            i.gid = g;
        }
        if let Some(x) = a.atime {
            i.atime = x.unwrap_or(t);
        }
        if let Some(x) = a.mtime {
            i.mtime = x.unwrap_or(t);
        }
        i.ctime = a.ctime.unwrap_or(t);
        if let Some(b) = a.btime {
            i.btime = b;
        }
        if let Some(c) = &a.by {
            // As the file was before the change.
            if a.size.is_some() {
                i.mode &= !c.cleared_by_write(mode0, gid0);
            }
            if a.uid.is_some() || a.gid.is_some() {
                i.mode &= !c.cleared_by_chown(mode0, gid0);
            }
        }
        st.save(&i);
        Ok(st.attr(&i))
    }

    /// fallocate: mode 0 or KEEP_SIZE reserve the range's unstored chunks
    /// uncompressed, so that their first write cannot meet ENOSPC (ENOSPC
    /// now if they do not fit); PUNCH_HOLE | KEEP_SIZE makes the range a
    /// hole and gives its reservations back; ZERO_RANGE zeroes and
    /// reserves it.
    pub fn fallocate(&self, ino: Ino, mode: u32, off: u64, len: u64) -> Result<()> {
        self.synced(self.fallocate_now(ino, mode, off, len, None), false)
    }

    /// [`Fs::fallocate`] by `by`, which clears set-ID bits as [`Caller`]
    /// says.
    pub fn fallocate_by(&self, ino: Ino, mode: u32, off: u64, len: u64, by: &Caller) -> Result<()> {
        self.synced(self.fallocate_now(ino, mode, off, len, Some(by)), false)
    }

    fn fallocate_now(&self, ino: Ino, mode: u32, off: u64, len: u64, by: Option<&Caller>) -> Result<()> {
        let mut st = self.st();
        if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            st.pre_relieve()?;
        } else {
            st.pre_op()?;
        }
        let mut i = st.file(ino)?;
        if len == 0 {
            return Err(Error::invalid("fallocate of 0 bytes"));
        }
        let end = off.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| {
            Error::file_too_big(format!("fallocate of {len} bytes at {off} passes the largest file size"))
        })?;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        match mode & !FALLOC_FL_KEEP_SIZE {
            0 => st.reserve(&mut i, off, end)?,
            FALLOC_FL_PUNCH_HOLE if keep => {
                st.zero_range(&mut i, off, len)?;
                st.unreserve_past_size(&mut i, off, end)?;
            }
            // Zeroed, and then reserved as mode 0 would: on a full file
            // system the range may be zeroed and ENOSPC answered, as ext4
            // may.
            FALLOC_FL_ZERO_RANGE => {
                st.zero_range(&mut i, off, len)?;
                st.reserve(&mut i, off, end)?;
            }
            _ => return Err(Error::not_supported(format!("fallocate mode {mode:#x} is not supported"))),
        }
        if !keep && end > i.size {
            i.size = end;
        }
        let t = now();
        if mode != 0 && mode != FALLOC_FL_KEEP_SIZE {
            i.mtime = t;
        }
        i.ctime = t;
        if let Some(c) = by {
            i.mode &= !c.cleared_by_write(i.mode, i.gid);
        }
        st.save(&i);
        Ok(())
    }

    /// Copy `len` bytes between files (through memory: no shared blocks).
    pub fn copy_file_range(&self, src: Ino, off_in: u64, dst: Ino, off_out: u64, len: u64) -> Result<u64> {
        self.copy_file_range_by(src, off_in, dst, off_out, len, None)
    }

    /// [`Fs::copy_file_range`] by `by`, which clears set-ID bits of the
    /// destination as [`Caller`] says.
    pub fn copy_file_range_by(
        &self,
        src: Ino,
        off_in: u64,
        dst: Ino,
        off_out: u64,
        len: u64,
        by: Option<&Caller>,
    ) -> Result<u64> {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(1 << 20) as usize;
            let buf = self.read(src, off_in + done, n)?;
            if buf.is_empty() {
                break;
            }
            self.synced(self.write_now(dst, off_out + done, &buf, by), false)?;
            done += buf.len() as u64;
        }
        Ok(done)
    }

    /// SEEK_DATA (`data` true) or SEEK_HOLE from `off`; ENXIO past the end.
    pub fn lseek(&self, ino: Ino, off: u64, data: bool) -> Result<u64> {
        let mut st = self.st();
        let i = st.inode(ino)?;
        st.seek(&i, off, data)?.ok_or_else(|| {
            Error::past_end(format!("no {} at or after {off}", if data { "data" } else { "hole" }))
        })
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

    /// Value of an xattr. `user.zlogfs.physical` gives the stored bytes of
    /// a file; `user.zlogfs.codec` its policy.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.st();
        let i = st.inode(ino)?;
        if name == XATTR_PHYSICAL {
            return Ok(st.physical(ino)?.to_string().into_bytes());
        }
        if name == XATTR_CLEAN && ino == ROOT {
            return match &st.last_clean {
                Some(r) => Ok(r.to_json().to_string().into_bytes()),
                None => Err(Error::no_attr("no cleaning pass has run since the mount")),
            };
        }
        if name == XATTR_CODEC {
            return match i.policy {
                Some(p) => Ok(p.to_string().into_bytes()),
                None => Err(Error::no_attr(format!("inode {ino} has no codec policy"))),
            };
        }
        check_xattr_name(name)?;
        st.get(&xattr_key(ino, name))?
            .ok_or_else(|| Error::no_attr(format!("inode {ino} has no xattr {:?}", name_str(name))))
    }

    /// Set an xattr ([`XATTR_CREATE`], [`XATTR_REPLACE`]).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.synced(self.setxattr_now(ino, name, value, flags), false)
    }

    fn setxattr_now(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        if name == XATTR_CLEAN {
            return self.clean_by_xattr(ino, value);
        }
        let mut st = self.st();
        st.pre_op()?;
        st.pre_grow(name.len() + value.len() + 64)?;
        let mut i = st.inode(ino)?;
        if name == XATTR_PHYSICAL {
            return Err(Error::not_permitted("user.zlogfs.physical is read-only"));
        }
        if name == acl::ACCESS && flags & XATTR_KILL_SGID != 0 {
            i.mode &= !0o2000;
        }
        let flags = flags & !XATTR_KILL_SGID;
        if name == acl::ACCESS {
            // The mode follows the ACL (the kernel leaves that to us).
            if let Some(entries) = acl::parse(value) {
                i.mode = (i.mode & !0o777) | acl::mode_bits(&entries);
            }
            if let Some(perm) = acl::equiv_mode(value) {
                // An access ACL that says no more than the mode is the mode
                // (as on ext4): `cp -a` and `tar --acls` set one on every
                // file, and storing it would cost index bytes per file.
                i.mode = (i.mode & !0o777) | perm;
                let k = xattr_key(ino, name);
                if st.get(&k)?.is_some() {
                    st.del(k);
                }
                i.ctime = now();
                st.save(&i);
                return Ok(());
            }
        }
        let exists = if name == XATTR_CODEC {
            i.policy.is_some()
        } else {
            check_xattr_name(name)?;
            if value.len() > st.xattr_limit() {
                return Err(Error::value_too_big(format!(
                    "xattr value of {} bytes exceeds {}",
                    value.len(),
                    st.xattr_limit()
                )));
            }
            st.get(&xattr_key(ino, name))?.is_some()
        };
        if flags & XATTR_CREATE != 0 && exists {
            return Err(Error::exists(format!("xattr {:?} exists", name_str(name))));
        }
        if flags & XATTR_REPLACE != 0 && !exists {
            return Err(Error::no_attr(format!("xattr {:?} does not exist", name_str(name))));
        }
        if name == XATTR_CODEC {
            let s = std::str::from_utf8(value).map_err(|_| Error::invalid("codec policy is not UTF-8"))?;
            let spec: CodecSpec =
                s.trim().parse().map_err(|e| Error::invalid(format!("bad codec policy {s:?}: {e}")))?;
            i.policy = Some(spec.normalized());
        } else {
            st.put(xattr_key(ino, name), value.to_vec());
        }
        i.ctime = now();
        st.save(&i);
        Ok(())
    }

    /// Names of an inode's xattrs.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let st = self.st();
        let i = st.inode(ino)?;
        let (lo, hi) = xattrs_range(ino);
        let mut v: Vec<Vec<u8>> = Vec::new();
        for (k, _) in st.scan(&lo, &hi, usize::MAX)? {
            if let Some((_, n)) = parse_xattr_key(&k) {
                v.push(n.to_vec());
            }
        }
        if i.policy.is_some() {
            v.push(XATTR_CODEC.to_vec());
        }
        Ok(v)
    }

    /// Remove an xattr.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.synced(self.removexattr_now(ino, name), false)
    }

    fn removexattr_now(&self, ino: Ino, name: &[u8]) -> Result<()> {
        let mut st = self.st();
        st.pre_relieve()?;
        let mut i = st.inode(ino)?;
        if name == XATTR_CODEC {
            if i.policy.take().is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no codec policy")));
            }
        } else {
            check_xattr_name(name)?;
            let k = xattr_key(ino, name);
            if st.get(&k)?.is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no xattr {:?}", name_str(name))));
            }
            st.del(k);
        }
        i.ctime = now();
        st.save(&i);
        Ok(())
    }

    /// Stored (compressed) bytes of a file.
    pub fn physical_bytes(&self, ino: Ino) -> Result<u64> {
        self.st().physical(ino)
    }

    /// Space and inode counts; free space as if nothing compressed.
    pub fn statfs(&self) -> Result<StatFs> {
        let st = self.st();
        let bsize = 4096u64;
        let (usable, free) = self.eng.capacity();
        // What fallocate reserved is taken.
        let free = free.saturating_sub(st.counters.reserved);
        let (total, free) = (usable / bsize, free / bsize);
        let used_inodes = st.cfg.next_ino - 1;
        let ffree = (1u64 << 32).saturating_sub(used_inodes);
        Ok(StatFs {
            bsize: bsize as u32,
            blocks: total,
            bfree: free,
            bavail: free,
            files: used_inodes + ffree,
            ffree,
            namelen: 255,
        })
    }
}
