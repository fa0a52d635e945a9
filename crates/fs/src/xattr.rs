//! Extended attributes: the user., trusted. and security. namespaces,
//! POSIX ACLs (kept consistent with the mode), and zlogfs's own
//! `user.zlogfs.*` names (a file's codec policy, its stored bytes, the
//! cleaner's report and trigger).

use zlogfs_engine::codec::CodecSpec;

use crate::error::{Error, Result};
use crate::filesystem::now;
use crate::keys::*;
use crate::namespace::name_str;
use crate::state::State;
use crate::{acl, Fs, XATTR_CODEC, XATTR_CREATE, XATTR_KILL_SGID, XATTR_PHYSICAL, XATTR_REPLACE};

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

impl State {
    fn xattr_limit(&self) -> usize {
        (self.group.max_bytes() / 8).min(zlogfs_engine::MAX_VALUE)
    }
}

impl Fs {
    /// Value of an xattr. `user.zlogfs.physical` gives the stored bytes of
    /// a file, or of a directory's subtree (a walk of it, as `du`),
    /// prefixed `~` when data not committed yet is counted at its
    /// uncompressed length; `user.zlogfs.codec` the codec policy.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.st();
        let i = st.inode(ino)?;
        if name == XATTR_PHYSICAL {
            let (n, estimated) =
                if i.kind() == Kind::Dir { st.subtree_physical(ino)? } else { st.physical_now(ino)? };
            return Ok(format!("{}{n}", if estimated { "~" } else { "" }).into_bytes());
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
}
