package idempgx

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// A group's reservations go as one statement over arrays ("reserve_many"
// with "find_many"): a merged groupCall whose members are the calls, in
// the group's order (their identities'). A statement's fixed cost in the
// server (bind, executor start-up and end, the table's check, the find's
// read) is then the group's, not each call's. Completions still go one
// statement each: an UPDATE over arrays could not be held to the primary
// key (see TestManyPlansUsePrimaryKey), and a CTE of one UPDATE per call,
// which is, saved 2 % of the server's work (each UPDATE's set-up is most
// of a completion's; BENCHMARKS.md).

// manyArg is one parameter of a merged call: an array whose element j is
// argument arg of members[j].
type manyArg struct {
	members []*groupCall
	arg     int
}

// manyStatements are the statements a grouper merges, and their forms for
// several calls (Store.New sets them).
type manyStatements struct {
	reserve, find         string // the single forms
	reserveMany, findMany string
}

// merge returns the calls to send for group: its reservations, when two or
// more, as one merged call in the place of the first, and every other call
// as it is. A reservation whose token another of the group's has too stays
// alone: the merged insert names the calls it inserted by their tokens.
func (m *manyStatements) merge(group []*groupCall) []*groupCall {
	var reserves []*groupCall
	for _, c := range group {
		if m.isReserve(c) && !tokenTaken(reserves, c) {
			reserves = append(reserves, c)
		}
	}
	if len(reserves) < 2 {
		return group
	}
	rm := &groupCall{sql: m.reserveMany, find: m.findMany, members: reserves, args: manyArgs(reserves, len(reserves[0].args))}
	out := make([]*groupCall, 0, len(group)-len(reserves)+1)
	j := 0 // reserves[j] is the next member in group
	for _, c := range group {
		if j < len(reserves) && c == reserves[j] {
			if j == 0 {
				out = append(out, rm)
			}
			j++
			continue
		}
		out = append(out, c)
	}
	return out
}

func (m *manyStatements) isReserve(c *groupCall) bool {
	return c.sql == m.reserve && c.find == m.find && len(c.args) == 10
}

// tokenTaken reports whether a reservation of calls has c's token.
func tokenTaken(calls []*groupCall, c *groupCall) bool {
	t, ok := argString(c.args[3])
	if !ok {
		return true
	}
	for _, o := range calls {
		if u, _ := argString(o.args[3]); u == t {
			return true
		}
	}
	return false
}

// manyArgs returns the n parameters of a merged call of members.
func manyArgs(members []*groupCall, n int) []any {
	args := make([]any, n)
	ms := make([]manyArg, n)
	for i := range ms {
		ms[i] = manyArg{members: members, arg: i}
		args[i] = &ms[i]
	}
	return args
}

// argString returns a string argument, plain or by pointer.
func argString(a any) (string, bool) {
	switch v := a.(type) {
	case string:
		return v, true
	case *string:
		if v != nil {
			return *v, true
		}
	}
	return "", false
}

// elementOIDs are the element types of the arrays a merged call sends.
var elementOIDs = map[uint32]uint32{
	pgtype.TextArrayOID:        pgtype.TextOID,
	pgtype.TimestamptzArrayOID: pgtype.TimestamptzOID,
	pgtype.IntervalArrayOID:    pgtype.IntervalOID,
}

// appendArray appends m as a one-dimensional array of type oid in
// PostgreSQL's binary format, or reports false for a type it does not
// encode.
func appendArray(buf []byte, m *manyArg, oid uint32) ([]byte, bool) {
	elem, ok := elementOIDs[oid]
	if !ok {
		return buf, false
	}
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	flags := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0) // has nulls
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(m.members)))
	buf = binary.BigEndian.AppendUint32(buf, 1) // lower bound
	for _, c := range m.members {
		at := len(buf)
		buf = append(buf, 0, 0, 0, 0)
		var null bool
		if buf, null, ok = appendElement(buf, c.args[m.arg], elem); !ok {
			return buf, false
		}
		if null {
			binary.BigEndian.PutUint32(buf[at:], ^uint32(0)) // -1
			binary.BigEndian.PutUint32(buf[flags:], 1)
			continue
		}
		binary.BigEndian.PutUint32(buf[at:], uint32(len(buf)-at-4))
	}
	return buf, true
}

// appendElement appends a, an argument of a call, as an element of type
// oid in binary, or reports null, or false for a type it does not encode.
func appendElement(buf []byte, a any, oid uint32) (out []byte, null, ok bool) {
	switch v := a.(type) {
	case *string:
		if v == nil {
			return buf, true, oid == pgtype.TextOID
		}
		return appendElement(buf, *v, oid)
	case string:
		if oid == pgtype.TextOID {
			return append(buf, v...), false, true
		}
	case *time.Time:
		if v == nil {
			return buf, true, oid == pgtype.TimestamptzOID
		}
		return appendElement(buf, *v, oid)
	case time.Time:
		if oid == pgtype.TimestamptzOID {
			return appendTimestamptz(buf, v), false, true
		}
	case *time.Duration:
		if v == nil {
			return buf, true, oid == pgtype.IntervalOID
		}
		return appendElement(buf, *v, oid)
	case time.Duration:
		if oid == pgtype.IntervalOID {
			return appendInterval(buf, v), false, true
		}
	}
	return buf, false, false
}

// errManyRow: a merged statement's row named no call of it.
var errManyRow = errors.New("idempgx: a merged statement returned a row of no call")

// readMany reads the results of a merged call into its members' (their
// err, inserted, found, dest). It returns an error of the whole statement
// (the server's or the connection's), which the group's sender then gives
// every member.
func (c *groupCall) readMany(r *directResults) error {
	rr, err := r.next()
	if err != nil {
		r.trace(c.sql, c.args, pgconn.CommandTag{}, err)
		return err
	}
	for rr.NextRow() {
		v := rr.Values()
		if len(v) != 1 {
			continue
		}
		for _, o := range c.members {
			if t, _ := argString(o.args[3]); t == string(v[0]) {
				o.inserted = true
				break
			}
		}
	}
	tag, err := rr.Close()
	r.trace(c.sql, c.args, tag, err)
	if err != nil {
		return err
	}
	rr, err = r.next()
	if err != nil {
		r.trace(c.find, c.args[:reserveFindArgs], pgconn.CommandTag{}, err)
		return err
	}
	rows := pgx.RowsFromResultReader(r.typeMap, rr)
	var bad error
	for rows.Next() {
		var i int32
		found := new(recordScan)
		if err := rows.Scan(append([]any{&i}, found.dest()...)...); err != nil {
			bad = err
			break
		}
		if i < 1 || int(i) > len(c.members) {
			bad = errManyRow
			break
		}
		c.members[i-1].found = found
	}
	rows.Close()
	err = rows.Err()
	if err == nil {
		err = bad
	}
	r.trace(c.find, c.args[:reserveFindArgs], rows.CommandTag(), err)
	if err != nil {
		return err
	}
	for _, o := range c.members {
		if !o.inserted && o.found == nil {
			o.err = pgx.ErrNoRows
		}
	}
	return nil
}
