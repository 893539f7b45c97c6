package migrate

import (
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestParseFileName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		base    string
		version int
		name    string
		up, ok  bool
	}{
		{"001_create_keys.up", 1, "create_keys", true, true},
		{"002_add_waiters.down", 2, "add_waiters", false, true},
		{"10_x.up", 10, "x", true, true},
		{"001_a_b_c.up", 1, "a_b_c", true, true},
		{"001_create_keys", 0, "", false, false},
		{"001_create_keys.sideways", 0, "", false, false},
		{"001_create_keys.up.old", 0, "", false, false},
		{"001.up", 0, "", false, false},
		{"001_.up", 0, "", false, false},
		{"create_keys.up", 0, "", false, false},
		{"000_zero.up", 0, "", false, false},
		{"-01_negative.up", 0, "", false, false},
		{"x01_letters.up", 0, "", false, false},
	}
	for _, tt := range tests {
		version, name, up, ok := parseFileName(tt.base)
		if version != tt.version || name != tt.name || up != tt.up || ok != tt.ok {
			t.Errorf("parseFileName(%q) = %d, %q, %v, %v; want %d, %q, %v, %v",
				tt.base, version, name, up, ok, tt.version, tt.name, tt.up, tt.ok)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		files   fstest.MapFS
		wantErr string
	}{
		{"ok", fstest.MapFS{
			"m/002_b.up.sql": file("2"), "m/002_b.down.sql": file("-2"),
			"m/001_a.up.sql": file("1"), "m/001_a.down.sql": file("-1"),
			"m/README.md":            file("ignored"),
			"m/old.sql/001_x.up.sql": file("a directory named .sql is ignored"),
		}, ""},
		{"no down", fstest.MapFS{"m/001_a.up.sql": file("1")}, "001_a lacks its up or down file"},
		{"no up", fstest.MapFS{"m/001_a.down.sql": file("1")}, "001_a lacks its up or down file"},
		{"empty", fstest.MapFS{"m/001_a.up.sql": file(" \n"), "m/001_a.down.sql": file("-1")}, "001_a.up.sql is empty"},
		{"bad name", fstest.MapFS{"m/a.up.sql": file("1")}, "want NNN_name"},
		{"bad direction", fstest.MapFS{"m/001_a.sideways.sql": file("1")}, "want NNN_name"},
		{"two names", fstest.MapFS{"m/001_a.up.sql": file("1"), "m/001_b.down.sql": file("-1")}, "two names"},
		{"gap", fstest.MapFS{
			"m/001_a.up.sql": file("1"), "m/001_a.down.sql": file("-1"),
			"m/003_c.up.sql": file("3"), "m/003_c.down.sql": file("-3"),
		}, "not 1..n: 003 is number 2"},
		{"no start", fstest.MapFS{"m/002_b.up.sql": file("2"), "m/002_b.down.sql": file("-2")}, "not 1..n"},
		{"no directory", fstest.MapFS{"other/001_a.up.sql": file("1")}, "m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ms, err := Load(tt.files, "m")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load = %v, %v; want an error containing %q", ms, err, tt.wantErr)
				}
				return
			}
			want := []Migration{{1, "a", "1", "-1"}, {2, "b", "2", "-2"}}
			if err != nil || len(ms) != len(want) || ms[0] != want[0] || ms[1] != want[1] {
				t.Fatalf("Load = %+v, %v; want %+v", ms, err, want)
			}
		})
	}
}

func TestMustLoad(t *testing.T) {
	t.Parallel()
	if ms := MustLoad(fstest.MapFS{"m/001_a.up.sql": file("1"), "m/001_a.down.sql": file("-1")}, "m"); len(ms) != 1 {
		t.Fatalf("MustLoad = %+v", ms)
	}
	defer func() {
		if msg, _ := recover().(string); !strings.HasPrefix(msg, "m: ") {
			t.Fatalf("MustLoad panicked with %q, want a message naming the directory", msg)
		}
	}()
	MustLoad(fstest.MapFS{"m/001_a.up.sql": file("1")}, "m")
	t.Fatal("MustLoad of a bad directory returned")
}

func TestMigrationString(t *testing.T) {
	t.Parallel()
	if got := (Migration{Version: 7, Name: "add_index"}).String(); got != "007_add_index" {
		t.Errorf("String = %q", got)
	}
}

// storeMigration is a store package's exported Migration type.
type storeMigration struct {
	// Version, Name, Applied and AppliedAt as in Status; the comments
	// differ, which conversion allows.
	Version   int
	Name      string
	Applied   bool
	AppliedAt time.Time
}

func TestAs(t *testing.T) {
	t.Parallel()
	if got := As[storeMigration](nil); got != nil {
		t.Errorf("As(nil) = %#v, want nil", got)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	got := As[storeMigration]([]Status{{1, "a", true, at}, {2, "b", false, time.Time{}}})
	want := []storeMigration{{1, "a", true, at}, {2, "b", false, time.Time{}}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("As = %+v, want %+v", got, want)
	}
	if got := AsOne[storeMigration](nil); got != nil {
		t.Errorf("AsOne(nil) = %+v, want nil", got)
	}
	if got := AsOne[storeMigration](&Status{2, "b", false, time.Time{}}); got == nil || *got != want[1] {
		t.Errorf("AsOne = %+v, want %+v", got, want[1])
	}
}

// TestLockID pins the advisory lock keys of the stores that existed before
// this package: a process of an older release must take the same lock.
func TestLockID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		lockName, schema string
		want             int64
	}{
		{"idempgx.migrate", "public", -288107369101705761},
		{"outbox.migrate", "public", -7458206768232347060},
	} {
		if got := LockID(tt.lockName, tt.schema); got != tt.want {
			t.Errorf("LockID(%q, %q) = %d, want %d", tt.lockName, tt.schema, got, tt.want)
		}
	}
	if LockID("a", "bc") == LockID("ab", "c") {
		t.Error("LockID does not separate the lock name from the schema")
	}
}
