package wire

import (
	"io/fs"
	"reflect"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

func TestFileEntryRoundTrip(t *testing.T) {
	when := time.Unix(1795000000, 123456789).Local()
	for _, fi := range []roche.FileInfo{
		{Name: "a.txt", Path: "/tmp/a.txt", Size: 42, Mode: 0o640, ModTime: when, UID: 1000, GID: 1001, Owner: "u", Group: "g"},
		{Name: "d", Path: "/tmp/d", Mode: fs.ModeDir | fs.ModeSticky | 0o1777&fs.ModePerm, IsDir: true, ModTime: when},
		{Name: "l", Path: "/tmp/l", Mode: fs.ModeSymlink | 0o777, Symlink: "/etc/hostname", ModTime: when},
		{Name: "p", Path: "/tmp/p", Mode: fs.ModeNamedPipe | 0o600, ModTime: when},
		{Name: "null", Path: "/dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666, ModTime: when},
		{Name: "su", Path: "/usr/bin/su", Mode: fs.ModeSetuid | 0o755, ModTime: when},
	} {
		pb := FileEntryToProto(fi)
		back := FileEntryFromProto(pb)
		if !reflect.DeepEqual(back, fi) {
			t.Errorf("%s: came back %+v, want %+v", fi.Path, back, fi)
		}
		if pb.Mode != uint32(fi.Mode.Perm()) || pb.Permissions != fi.Mode.String() {
			t.Errorf("%s: mode %o permissions %q", fi.Path, pb.Mode, pb.Permissions)
		}
	}
	// Every field of an entry is filled from a FileInfo that has them all.
	full := roche.FileInfo{Name: "l", Path: "/tmp/l", Size: 1, Mode: fs.ModeSymlink | 0o777, Symlink: "x",
		ModTime: when, UID: 1, GID: 2, Owner: "o", Group: "g"}
	m := FileEntryToProto(full).ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if !m.Has(fields.Get(i)) {
			t.Errorf("FileEntry.%s is not sent", fields.Get(i).Name())
		}
	}
	// A sender that gives only the type and the bits (E2B's shape).
	got := FileEntryFromProto(&rochev1.FileEntry{Name: "d", Path: "/d", Type: rochev1.FileType_FILE_TYPE_DIRECTORY, Mode: 0o755})
	if got.Mode != fs.ModeDir|0o755 || !got.IsDir {
		t.Errorf("type and bits only: %v", got.Mode)
	}
	for typ, want := range map[string]rochev1.FileType{"file": rochev1.FileType_FILE_TYPE_FILE, "dir": rochev1.FileType_FILE_TYPE_DIRECTORY,
		"symlink": rochev1.FileType_FILE_TYPE_SYMLINK, "fifo": rochev1.FileType_FILE_TYPE_OTHER} {
		fi := roche.FileInfo{Mode: map[string]fs.FileMode{"file": 0, "dir": fs.ModeDir, "symlink": fs.ModeSymlink, "fifo": fs.ModeNamedPipe}[typ]}
		if got := FileTypeToProto(fi); got != want {
			t.Errorf("%s: %v, want %v", typ, got, want)
		}
	}
}

func TestFileEventRoundTrip(t *testing.T) {
	for op := range fileOps {
		ev := roche.FileEvent{Name: "a/b", Op: op, Lost: 3}
		back, err := FileEventFromProto(FileEventToProto(ev))
		if err != nil || back != ev {
			t.Errorf("%s: %+v %v", op, back, err)
		}
	}
	if _, err := FileEventFromProto(&rochev1.FileEvent{Type: 99}); err == nil {
		t.Error("an unknown event type was accepted")
	}
	if len(fileOps) != len(rochev1.FileEventType_name)-1 {
		t.Errorf("%d event kinds converted, the wire has %d", len(fileOps), len(rochev1.FileEventType_name)-1)
	}
}
