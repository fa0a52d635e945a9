//! POSIX ACLs in the kernel's xattr form (`system.posix_acl_access` and
//! `system.posix_acl_default`): a little-endian u32 version (2), then
//! 8-byte entries of u16 tag, u16 perm, u32 id. The kernel checks
//! permissions against them (the FUSE mount asks it to); the file system
//! keeps them consistent with the mode, as Linux's posix_acl_chmod and
//! posix_acl_create do, and gives new entries their directory's default ACL.

/// The xattr of an access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The xattr of a directory's default ACL.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// One ACL entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// ACL_USER_OBJ, ACL_USER, ...
    pub tag: u16,
    /// rwx bits.
    pub perm: u16,
    /// uid or gid for ACL_USER and ACL_GROUP.
    pub id: u32,
}

/// Decode; None when the bytes are not a well-formed ACL.
pub fn parse(v: &[u8]) -> Option<Vec<Entry>> {
    let (head, body) = v.split_at_checked(4)?;
    if u32::from_le_bytes(head.try_into().ok()?) != VERSION || body.len() % 8 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 8);
    for e in body.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&tag) {
            return None;
        }
        out.push(Entry {
            tag,
            perm: u16::from_le_bytes([e[2], e[3]]) & 7,
            id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
        });
    }
    let has = |t| out.iter().any(|e| e.tag == t);
    (has(USER_OBJ) && has(GROUP_OBJ) && has(OTHER)).then_some(out)
}

/// Encode.
pub fn encode(acl: &[Entry]) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    for e in acl {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        v.extend_from_slice(&e.id.to_le_bytes());
    }
    v
}

/// The permission bits of an ACL that says no more than a mode (only the
/// owner, group and other entries, once each); None otherwise.
pub fn equiv_mode(v: &[u8]) -> Option<u32> {
    let acl = parse(v)?;
    if acl.len() != 3 {
        return None;
    }
    let mut mode = 0;
    for e in &acl {
        let shift = match e.tag {
            USER_OBJ => 6,
            GROUP_OBJ => 3,
            OTHER => 0,
            _ => return None,
        };
        mode |= u32::from(e.perm) << shift;
    }
    Some(mode)
}

/// The permission bits an access ACL gives the mode (Linux's
/// posix_acl_update_mode): owner from the owner entry, group from the mask
/// (or the group entry, without a mask), other from the other entry.
pub fn mode_bits(acl: &[Entry]) -> u32 {
    let has_mask = acl.iter().any(|e| e.tag == MASK);
    let mut m = 0;
    for e in acl {
        let p = u32::from(e.perm);
        match e.tag {
            USER_OBJ => m |= p << 6,
            MASK => m |= p << 3,
            GROUP_OBJ if !has_mask => m |= p << 3,
            OTHER => m |= p,
            _ => {}
        }
    }
    m
}

/// The access ACL after a chmod to `mode` (Linux's posix_acl_chmod): the
/// owner, mask (or group, without a mask) and other entries take the
/// mode's bits.
pub fn chmod(acl: &mut [Entry], mode: u32) {
    let has_mask = acl.iter().any(|e| e.tag == MASK);
    for e in acl.iter_mut() {
        match e.tag {
            USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
            MASK => e.perm = ((mode >> 3) & 7) as u16,
            GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
            OTHER => e.perm = (mode & 7) as u16,
            _ => {}
        }
    }
}

/// The access ACL and permission bits of a new entry created with `mode`
/// in a directory with default ACL `acl` (Linux's posix_acl_create: the
/// umask is not applied; the mode masks the ACL and the ACL the mode).
/// Returns the ACL, the new permission bits, and whether the ACL says more
/// than the mode (only then is it stored).
pub fn create(mut acl: Vec<Entry>, mode: u32) -> (Vec<Entry>, u32, bool) {
    let mut m = mode & 0o777;
    let mut not_equiv = false;
    for e in acl.iter_mut() {
        match e.tag {
            USER_OBJ => {
                e.perm &= ((m >> 6) & 7) as u16;
                m &= (u32::from(e.perm) << 6) | !0o700;
            }
            USER | GROUP | MASK => not_equiv = true,
            OTHER => {
                e.perm &= (m & 7) as u16;
                m &= u32::from(e.perm) | !0o007;
            }
            _ => {}
        }
    }
    let group_tag = if acl.iter().any(|e| e.tag == MASK) { MASK } else { GROUP_OBJ };
    if let Some(e) = acl.iter_mut().find(|e| e.tag == group_tag) {
        e.perm &= ((m >> 3) & 7) as u16;
        m &= (u32::from(e.perm) << 3) | !0o070;
    }
    (acl, m & 0o777, not_equiv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        encode(&entries.iter().map(|&(tag, perm, id)| Entry { tag, perm, id }).collect::<Vec<_>>())
    }

    const M: u32 = u32::MAX;

    #[test]
    fn minimal_acls_are_modes() {
        assert_eq!(equiv_mode(&acl(&[(1, 6, M), (4, 4, M), (0x20, 0, M)])), Some(0o640));
        // A named user (tag 2) and a mask (0x10) make a real ACL.
        assert_eq!(equiv_mode(&acl(&[(1, 7, M), (2, 7, 1000), (4, 5, M), (0x10, 7, M), (0x20, 5, M)])), None);
        assert_eq!(equiv_mode(&acl(&[(1, 7, M), (4, 5, M)])), None);
        assert_eq!(equiv_mode(&acl(&[(1, 7, M), (1, 7, M), (4, 5, M), (0x20, 5, M)])), None);
        assert_eq!(equiv_mode(b"\x01\0\0\0"), None);
        assert_eq!(equiv_mode(b""), None);
        assert!(parse(&acl(&[(1, 7, M), (0x40, 7, M), (4, 5, M), (0x20, 5, M)])).is_none(), "unknown tag");
    }

    #[test]
    fn create_masks_like_linux() {
        // Default ACL u::rwx, u:1000:rwx, g::r-x, m::rwx, o::r-x; a file
        // created with 0666 gets rw- for the owner, the mask r w- ... as
        // posix_acl_create computes.
        let d = parse(&acl(&[(1, 7, M), (2, 7, 1000), (4, 5, M), (0x10, 7, M), (0x20, 5, M)])).unwrap();
        let (a, mode, not_equiv) = create(d.clone(), 0o666);
        assert!(not_equiv);
        assert_eq!(mode, 0o664);
        assert_eq!(a.iter().find(|e| e.tag == MASK).unwrap().perm, 6);
        assert_eq!(a.iter().find(|e| e.tag == USER).unwrap().perm, 7, "named entries keep their bits");
        // A minimal default ACL: the mode is masked by it, nothing stored.
        let d = parse(&acl(&[(1, 7, M), (4, 5, M), (0x20, 0, M)])).unwrap();
        let (_, mode, not_equiv) = create(d, 0o777);
        assert_eq!((mode, not_equiv), (0o750, false));
    }

    #[test]
    fn chmod_updates_mask_or_group() {
        let mut a = parse(&acl(&[(1, 7, M), (2, 7, 1000), (4, 5, M), (0x10, 7, M), (0x20, 5, M)])).unwrap();
        chmod(&mut a, 0o640);
        let p = |t| a.iter().find(|e| e.tag == t).unwrap().perm;
        assert_eq!((p(USER_OBJ), p(MASK), p(GROUP_OBJ), p(OTHER), p(USER)), (6, 4, 5, 0, 7));
        assert_eq!(mode_bits(&a), 0o640);
    }
}
