package idem

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
)

// recorder buffers the handler's response so that it can be stored before the
// client sees it: a client that receives an answer and retries at once is
// replayed, never told the key is still in progress. A response larger than
// the limit, or one the handler flushes or hijacks, switches to pass-through
// and is marked not replayable.
//
// It keeps http.Flusher, http.Hijacker and Unwrap working, so
// http.ResponseController reaches the underlying writer.
type recorder struct {
	w           http.ResponseWriter
	max         int64
	status      int
	wroteHeader bool
	buf         []byte
	// streamed reports that the response went to the client before the
	// handler returned (flush, hijack or over the limit).
	streamed bool
	hijacked bool
	// sent reports that the status line went to the underlying writer.
	sent bool
	// writeErr is the first error the underlying writer returned: the
	// client went away while the answer streamed to it.
	writeErr error
	// contentLength backs the Content-Length value finish sets.
	contentLength [1]string
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	if r.wroteHeader {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// Informational responses (103 Early Hints) go through at once and
		// are not part of the stored response.
		r.w.WriteHeader(code)
		return
	}
	r.status = code
	r.wroteHeader = true
	if offRecorder {
		r.sent = true
		r.w.WriteHeader(code)
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if r.streamed || offRecorder {
		return r.sawErr(r.w.Write(p))
	}
	if int64(len(r.buf)+len(p)) > r.max {
		if err := r.stream(); err != nil {
			return 0, err
		}
		return r.sawErr(r.w.Write(p))
	}
	if r.buf == nil {
		r.buf = r.sized(len(p))
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

// WriteString writes s without converting it to a byte slice first.
func (r *recorder) WriteString(s string) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if r.streamed || offRecorder {
		return r.sawErr(io.WriteString(r.w, s))
	}
	if int64(len(r.buf)+len(s)) > r.max {
		if err := r.stream(); err != nil {
			return 0, err
		}
		return r.sawErr(io.WriteString(r.w, s))
	}
	if r.buf == nil {
		r.buf = r.sized(len(s))
	}
	r.buf = append(r.buf, s...)
	return len(s), nil
}

// sized returns the buffer for a response whose first write is n bytes:
// with room for the whole body when the handler declared a larger
// Content-Length within the limit (a proxied answer arrives in reads of up
// to 32 KiB, and growing the buffer read by read would allocate about
// twice the body), else nil, for append to size.
func (r *recorder) sized(n int) []byte {
	cl := r.w.Header()["Content-Length"] // h.Get without canonicalising
	if len(cl) != 1 {
		return nil
	}
	size, err := strconv.ParseInt(cl[0], 10, 64)
	if err != nil || size <= int64(n) || size > r.max {
		return nil
	}
	return make([]byte, 0, size)
}

// stream sends what is buffered and switches to pass-through.
func (r *recorder) stream() error {
	if r.streamed {
		return nil
	}
	r.streamed = true
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	r.sent = true
	r.w.WriteHeader(r.status)
	if len(r.buf) > 0 {
		_, err := r.sawErr(r.w.Write(r.buf))
		r.buf = nil
		return err
	}
	return nil
}

// sawErr passes on the result of a write to the underlying writer,
// remembering its first error.
func (r *recorder) sawErr(n int, err error) (int, error) {
	if err != nil && r.writeErr == nil {
		r.writeErr = err
	}
	return n, err
}

// Flush implements http.Flusher: the response is streamed from here on.
func (r *recorder) Flush() {
	_ = r.FlushError()
}

// FlushError is the error-returning flush http.ResponseController prefers.
func (r *recorder) FlushError() error {
	if err := r.stream(); err != nil {
		return err
	}
	err := http.NewResponseController(r.w).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		r.sawErr(0, err)
	}
	return err
}

// Hijack implements http.Hijacker. A hijacked response is never replayable.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.w).Hijack()
	if err == nil {
		r.streamed, r.hijacked, r.sent = true, true, true
		if !r.wroteHeader {
			r.status, r.wroteHeader = http.StatusSwitchingProtocols, true
		}
	}
	return conn, rw, err
}

// clientGone reports whether a write to the client failed because the
// connection broke (not because the handler misused the writer).
func (r *recorder) clientGone() bool {
	err := r.writeErr
	return err != nil && !errors.Is(err, http.ErrBodyNotAllowed) &&
		!errors.Is(err, http.ErrContentLength) && !errors.Is(err, http.ErrHijacked)
}

// Unwrap returns the underlying writer for http.ResponseController.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// finalStatus is the status the handler answered with.
func (r *recorder) finalStatus() int {
	if !r.wroteHeader {
		return http.StatusOK
	}
	return r.status
}

// discard drops a buffered response and the handler's headers so another
// answer can be written. It reports false when the response already went
// to the client.
func (r *recorder) discard() bool {
	if r.sent || r.streamed || r.hijacked {
		return false
	}
	r.sent = true
	r.buf = nil
	clear(r.w.Header())
	return true
}

// finish sends a buffered response to the client.
func (r *recorder) finish() {
	if r.sent || r.hijacked {
		return
	}
	r.sent = true
	if !r.wroteHeader {
		r.status, r.wroteHeader = http.StatusOK, true
	}
	if !r.streamed {
		if h := r.w.Header(); r.status != http.StatusNoContent && r.status != http.StatusNotModified &&
			(len(h["Content-Length"]) == 0 || h["Content-Length"][0] == "") { // h.Get without canonicalising
			r.contentLength[0] = strconv.Itoa(len(r.buf))
			h["Content-Length"] = r.contentLength[:]
		}
		r.w.WriteHeader(r.status)
		if len(r.buf) > 0 {
			r.w.Write(r.buf)
		}
	}
}
