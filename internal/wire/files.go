package wire

import (
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// FileEntryToProto describes a path on the wire, as E2B's EntryInfo: mode is the
// permission bits; permissions carries the whole mode as Go prints it.
func FileEntryToProto(fi roche.FileInfo) *rochev1.FileEntry {
	name := fi.Name
	if name == "" {
		name = path.Base(fi.Path)
	}
	return &rochev1.FileEntry{
		Name: name, Type: FileTypeToProto(fi), Path: fi.Path, Size: fi.Size,
		Mode: uint32(fi.Mode.Perm()), Permissions: fi.Mode.String(),
		Owner: fi.Owner, Group: fi.Group, ModifiedTime: timeToProto(fi.ModTime),
		SymlinkTarget: fi.Symlink, Uid: uint32(fi.UID), Gid: uint32(fi.GID),
	}
}

// FileEntryFromProto is the core's FileInfo of an entry: its type bits come back from
// permissions, or from type when a sender left permissions out.
func FileEntryFromProto(pb *rochev1.FileEntry) roche.FileInfo {
	if pb == nil {
		return roche.FileInfo{}
	}
	mode, ok := modeFromString(pb.Permissions)
	if !ok {
		mode = fs.FileMode(pb.Mode) & fs.ModePerm
		switch pb.Type {
		case rochev1.FileType_FILE_TYPE_DIRECTORY:
			mode |= fs.ModeDir
		case rochev1.FileType_FILE_TYPE_SYMLINK:
			mode |= fs.ModeSymlink
		case rochev1.FileType_FILE_TYPE_OTHER:
			mode |= fs.ModeIrregular
		}
	}
	return roche.FileInfo{
		Name: pb.Name, Path: pb.Path, Size: pb.Size, Mode: mode, IsDir: mode.IsDir(),
		Symlink: pb.SymlinkTarget, ModTime: timeFromProto(pb.ModifiedTime),
		UID: int(pb.Uid), GID: int(pb.Gid), Owner: pb.Owner, Group: pb.Group,
	}
}

// FileTypeToProto is what fi is, as the wire says it.
func FileTypeToProto(fi roche.FileInfo) rochev1.FileType {
	switch fi.FileType() {
	case "file":
		return rochev1.FileType_FILE_TYPE_FILE
	case "dir":
		return rochev1.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		return rochev1.FileType_FILE_TYPE_SYMLINK
	}
	return rochev1.FileType_FILE_TYPE_OTHER
}

// modeTypeLetters are fs.FileMode's type and special letters, its bits from the top
// (what FileMode.String prints before the nine permission characters).
const modeTypeLetters = "dalTLDpSugct?"

// modeFromString parses what fs.FileMode.String printed.
func modeFromString(s string) (fs.FileMode, bool) {
	if len(s) < 10 {
		return 0, false
	}
	head, perm := s[:len(s)-9], s[len(s)-9:]
	var mode fs.FileMode
	if head != "-" {
		for _, c := range head {
			i := strings.IndexRune(modeTypeLetters, c)
			if i < 0 {
				return 0, false
			}
			mode |= 1 << uint(32-1-i)
		}
	}
	const rwx = "rwxrwxrwx"
	for i, c := range perm {
		switch c {
		case rune(rwx[i]):
			mode |= 1 << uint(9-1-i)
		case '-':
		default:
			return 0, false
		}
	}
	return mode, true
}

// FileEventToProto is a change on the wire.
func FileEventToProto(ev roche.FileEvent) *rochev1.FileEvent {
	return &rochev1.FileEvent{Name: ev.Name, Type: fileOps[ev.Op], Lost: ev.Lost}
}

// FileEventFromProto is the core's event of one on the wire.
func FileEventFromProto(pb *rochev1.FileEvent) (roche.FileEvent, error) {
	for op, t := range fileOps {
		if t == pb.GetType() {
			return roche.FileEvent{Name: pb.GetName(), Op: op, Lost: pb.GetLost()}, nil
		}
	}
	return roche.FileEvent{}, fmt.Errorf("unknown file event type %v", pb.GetType())
}

var fileOps = map[roche.FileOp]rochev1.FileEventType{
	roche.FileCreate:   rochev1.FileEventType_FILE_EVENT_TYPE_CREATE,
	roche.FileWrite:    rochev1.FileEventType_FILE_EVENT_TYPE_WRITE,
	roche.FileRemove:   rochev1.FileEventType_FILE_EVENT_TYPE_REMOVE,
	roche.FileRename:   rochev1.FileEventType_FILE_EVENT_TYPE_RENAME,
	roche.FileChmod:    rochev1.FileEventType_FILE_EVENT_TYPE_CHMOD,
	roche.FileOverflow: rochev1.FileEventType_FILE_EVENT_TYPE_OVERFLOW,
}
