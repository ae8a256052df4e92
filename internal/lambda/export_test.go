package lambda

import "context"

// PackageSize is the zipped size of the package s builds for the source in
// dir (a task's), and the size of the bootstrap binary in it.
func (s *Server) PackageSize(dir string) (zipped int, bootstrap uint64, err error) {
	p, err := s.build(context.Background(), dir, s.spec("", nil, 60))
	if err != nil {
		return 0, 0, err
	}
	return len(p.zip), s.boot.hdr.UncompressedSize64, nil
}

// RemoveDeleted is removeDeleted, for the checks of names no bootstrap
// makes.
var RemoveDeleted = removeDeleted

// CopyWholeDirectories makes s write back a task's whole directory, as
// before the bootstrap listed its changes (removing nothing), or not.
func (s *Server) CopyWholeDirectories(on bool) { s.wholeWriteBack.Store(on) }
