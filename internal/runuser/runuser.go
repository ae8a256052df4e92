// Package runuser is the unprivileged user that a Stoke started as root
// runs the Runs' programs as: its credential for starting a process, and
// the few ways the server makes a directory or file usable by it without
// giving it anything else — a passage (a directory it may pass through but
// not list), and the handing over of a directory the server made.
//
// The server itself stays root: it keeps managing cgroups, reaping orphans
// and killing whatever a Run starts. A nil *User means "as this process":
// every method is then what Stoke did before there was a run user (0700
// directories of the server's own, nothing handed over).
package runuser

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultID is the user and group ID Runs run as when stoke up is root and
// no --run-as-user is given. It names no account: it is below 65536, so
// that a user namespace with the usual 65536 IDs maps it, and it is neither
// nobody (65534, which other daemons and NFS's squashing use, so that a
// Run as nobody could signal them or read their files) nor 65535, and lies
// in 65520–65533, which systemd leaves unallocated (its dynamic users end
// at 65519) and Debian reserves. Default refuses it when the user database
// names it after all.
const DefaultID = 65533

// User is a user and group ID that the Runs' processes run as, with no
// supplementary groups.
type User struct {
	UID, GID uint32
}

// String is "UID:GID", the --run-as-user syntax.
func (u *User) String() string {
	if u == nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", u.UID, u.GID)
}

// Parse reads "UID[:GID]" (numbers; GID defaults to UID). Root, as user
// or group, is refused: the point is that Runs never run as root.
func Parse(s string) (*User, error) {
	uidText, gidText, hasGID := strings.Cut(s, ":")
	if !hasGID {
		gidText = uidText
	}
	uid, err1 := strconv.ParseUint(uidText, 10, 32)
	gid, err2 := strconv.ParseUint(gidText, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("--run-as-user %q: want UID[:GID], numbers", s)
	}
	if uid == 0 || gid == 0 {
		return nil, fmt.Errorf("--run-as-user %q: Runs never run as root (user or group 0)", s)
	}
	// (uid_t)-1 means "no change" to setresuid and chown.
	if uid == 1<<32-1 || gid == 1<<32-1 {
		return nil, fmt.Errorf("--run-as-user %q: 4294967295 is not an ID", s)
	}
	return &User{UID: uint32(uid), GID: uint32(gid)}, nil
}

// Default is the dedicated user and group DefaultID, refused when the user
// or group database names it: then it may own files or run processes, and
// a Run could reach them. --run-as-user chooses another.
func Default() (*User, error) {
	id := strconv.Itoa(DefaultID)
	if u, err := user.LookupId(id); err == nil {
		return nil, fmt.Errorf("the Runs' default user ID %d is the account %q here: choose an ID that owns nothing with --run-as-user UID[:GID]", DefaultID, u.Username)
	}
	if g, err := user.LookupGroupId(id); err == nil {
		return nil, fmt.Errorf("the Runs' default group ID %d is the group %q here: choose an ID that owns nothing with --run-as-user UID[:GID]", DefaultID, g.Name)
	}
	return &User{UID: DefaultID, GID: DefaultID}, nil
}

// Credential is what a process starts with to run as u with no
// supplementary groups (an empty Groups drops them); nil for a nil u: as
// this process.
func (u *User) Credential() *syscall.Credential {
	if u == nil {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
}

// Passage makes dir (its parent exists) or takes the existing one, a
// directory of this process's own, as one that u may pass through to
// what it was given inside, but not list: mode 0710, group u's. Without
// a u it is a private directory, mode 0700, as before.
func (u *User) Passage(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if u == nil {
		return nil
	}
	return u.passage(dir)
}

// PassageAll is Passage of dir and of each of its parents up to, not
// including, top (which must contain dir): each is made if missing.
func (u *User) PassageAll(top, dir string) error {
	rel, err := filepath.Rel(top, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("runuser: %s is not inside %s", dir, top)
	}
	p := top
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if part == "." {
			continue
		}
		p = filepath.Join(p, part)
		if err := u.Passage(p); err != nil {
			return err
		}
	}
	return nil
}

// passage sets an existing directory of ours to mode 0710, group u's,
// through a handle that does not follow a symbolic link.
func (u *User) passage(dir string) error {
	f, err := openDir(unix.AT_FDCWD, dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("runuser: %s belongs to uid %d, not to this process", dir, st.Uid)
	}
	if err := unix.Fchown(int(f.Fd()), -1, int(u.GID)); err != nil {
		return &os.PathError{Op: "chown", Path: dir, Err: err}
	}
	if err := unix.Fchmod(int(f.Fd()), 0o710); err != nil {
		return &os.PathError{Op: "chmod", Path: dir, Err: err}
	}
	return nil
}

// GiveFile hands the open file f, which this process made, to u (fchown:
// no path is followed). Nothing without a u.
func (u *User) GiveFile(f *os.File) error {
	if u == nil {
		return nil
	}
	if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
		return err
	}
	return nil
}

// Mkdir makes dir (its parent exists), mode 0700, and hands it to u.
func (u *User) Mkdir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if u == nil {
		return nil
	}
	return u.giveTop(dir)
}

// Give hands the directory dir and everything in it to u: a working
// directory the server (or runtimed) made and filled, as root, before the
// Run's first process starts. A directory that is u's already was given
// before (what is in it is u's business) and is left as it is, so that the
// walk never goes through a directory u could change under it; the walk
// opens each directory without following a symbolic link, and changes
// each entry's owner without following one either. The top goes last: u
// cannot enter until everything in it is u's.
func (u *User) Give(dir string) error {
	if u == nil {
		return nil
	}
	top, err := openDir(unix.AT_FDCWD, dir)
	if err != nil {
		return err
	}
	defer top.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(top.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if st.Uid == u.UID {
		return nil
	}
	if err := u.giveInside(top, dir, 0); err != nil {
		return err
	}
	if err := unix.Fchown(int(top.Fd()), int(u.UID), int(u.GID)); err != nil {
		return &os.PathError{Op: "chown", Path: dir, Err: err}
	}
	return nil
}

// maxDepth bounds the walk of Give (a source archive's directories).
const maxDepth = 64

// giveInside hands every entry of the open directory d (named name) to u,
// depth first.
func (u *User) giveInside(d *os.File, name string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("runuser: %s: deeper than %d directories", name, maxDepth)
	}
	for {
		entries, err := d.ReadDir(256)
		for _, e := range entries {
			if e.IsDir() {
				sub, err := openDir(int(d.Fd()), e.Name())
				if err != nil {
					return fmt.Errorf("runuser: %w", err)
				}
				err = u.giveInside(sub, filepath.Join(name, e.Name()), depth+1)
				sub.Close()
				if err != nil {
					return err
				}
			}
			if err := unix.Fchownat(int(d.Fd()), e.Name(), int(u.UID), int(u.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &os.PathError{Op: "chown", Path: filepath.Join(name, e.Name()), Err: err}
			}
		}
		if err == io.EOF || len(entries) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("runuser: %w", err)
		}
	}
}

// giveTop hands the directory dir itself (not what it holds) to u.
func (u *User) giveTop(dir string) error {
	f, err := openDir(unix.AT_FDCWD, dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fchown(int(f.Fd()), int(u.UID), int(u.GID)); err != nil {
		return &os.PathError{Op: "chown", Path: dir, Err: err}
	}
	return nil
}

// openDir opens the directory name in dirfd without following a symbolic
// link in its last component.
func openDir(dirfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Reaches checks that u can pass through every directory above path and
// path itself (search permission by owner, group or others; ACLs are not
// read), so that the Runs can reach what they are given inside it. The
// error names the first directory that stops it.
func (u *User) Reaches(path string) error {
	if u == nil {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !u.may(st, fi.Mode().Perm(), 0o1) {
			return fmt.Errorf("the Runs' user %s cannot pass through %s (mode %#o, owner %d:%d), on the way to %s", u, p, fi.Mode().Perm(), st.Uid, st.Gid, abs)
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

// LookPath finds the program name as exec.LookPath does in path (a
// PATH), but only one u can run: each directory above it must let u pass
// and the file (symbolic links followed) be executable by u. A name with
// a slash is checked as it is. Runs started as u cannot use an
// interpreter installed under root's home (a version manager's shims in
// /root, mode 0700), which the server's own PATH may put first.
func (u *User) LookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		if err := u.canExecute(name); err != nil {
			return "", err
		}
		return name, nil
	}
	var first error
	for _, d := range filepath.SplitList(path) {
		if !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		err := u.canExecute(p)
		if err == nil {
			return p, nil
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return "", fmt.Errorf("no %s in PATH that the Runs' user %s can run: %w", name, u, first)
	}
	return "", fmt.Errorf("no %s in PATH", name)
}

// canExecute checks that u can reach and execute the file p.
func (u *User) canExecute(p string) error {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return err
	}
	for _, q := range []string{filepath.Dir(p), filepath.Dir(real)} {
		if err := u.Reaches(q); err != nil {
			return err
		}
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && u.may(st, fi.Mode().Perm(), 0o1) {
		return nil
	}
	return fmt.Errorf("the Runs' user %s cannot execute %s (mode %#o)", u, real, fi.Mode().Perm())
}

// may reports whether u has the permission bit bit (0o4 read, 0o2
// write, 0o1 execute or search) on a file with owner and group st and
// permission bits perm, as the kernel decides without ACLs.
func (u *User) may(st *syscall.Stat_t, perm os.FileMode, bit os.FileMode) bool {
	switch {
	case st.Uid == u.UID:
		return perm&(bit<<6) != 0
	case st.Gid == u.GID:
		return perm&(bit<<3) != 0
	default:
		return perm&bit != 0
	}
}
