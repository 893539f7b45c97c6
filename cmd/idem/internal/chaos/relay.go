package chaos

import (
	"net"
	"sync"
	"time"
)

// Relay is a TCP relay between a proxy and its store that can misbehave:
// add latency, drop or reset every connection, or blackhole the traffic (a
// partition: nothing passes, connections are neither refused nor closed,
// until it heals). Bytes keep their order in each direction.
type Relay struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	latency   time.Duration
	blackhole bool
	healed    chan struct{} // closed when the blackhole ends
	conns     map[*relayConn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

type relayConn struct {
	client, server net.Conn
}

// NewRelay listens on a free loopback port and relays every connection to
// target.
func NewRelay(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: target, conns: make(map[*relayConn]struct{}), healed: make(chan struct{})}
	close(r.healed)
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// SetLatency delays every chunk of bytes by d in each direction (0 ends
// it) and returns the latency it replaces.
func (r *Relay) SetLatency(d time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.latency
	r.latency = d
	return prev
}

// Blackhole starts (on) or heals (off) a partition.
func (r *Relay) Blackhole(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on == r.blackhole {
		return
	}
	r.blackhole = on
	if on {
		r.healed = make(chan struct{})
	} else {
		close(r.healed)
	}
}

// Retarget sends every new connection to target and drops the current
// ones: a virtual address moved to another server, as a failover does.
func (r *Relay) Retarget(target string) {
	r.mu.Lock()
	r.target = target
	r.mu.Unlock()
	r.Drop()
}

// Drop closes every connection (FIN to both sides), as a middlebox that
// forgets its connections would.
func (r *Relay) Drop() { r.cut(false) }

// Reset resets every connection (RST to both sides).
func (r *Relay) Reset() { r.cut(true) }

func (r *Relay) cut(reset bool) {
	r.mu.Lock()
	conns := make([]*relayConn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		for _, conn := range []net.Conn{c.client, c.server} {
			if tc, ok := conn.(*net.TCPConn); ok && reset {
				tc.SetLinger(0)
			}
			conn.Close()
		}
	}
}

// Close stops the relay and closes every connection.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	if r.blackhole {
		r.blackhole = false
		close(r.healed)
	}
	r.mu.Unlock()
	r.ln.Close()
	r.Drop()
	r.wg.Wait()
}

// gate waits while the relay is blackholed and returns the latency to
// add, or false once the relay is closed.
func (r *Relay) gate() (time.Duration, bool) {
	for {
		r.mu.Lock()
		latency, healed, closed := r.latency, r.healed, r.closed
		r.mu.Unlock()
		if closed {
			return 0, false
		}
		select {
		case <-healed:
			return latency, true
		default:
		}
		<-healed
	}
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.serve(client)
	}
}

func (r *Relay) serve(client net.Conn) {
	defer r.wg.Done()
	if _, ok := r.gate(); !ok { // a partition holds new connections too
		client.Close()
		return
	}
	r.mu.Lock()
	target := r.target
	r.mu.Unlock()
	server, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		client.Close() // the store is down: the proxy sees its connection end
		return
	}
	c := &relayConn{client: client, server: server}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.pipe(server, client) }()
	go func() { defer wg.Done(); r.pipe(client, server) }()
	wg.Wait()
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// chunk is bytes read from one side and due on the other.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst: a reader that stamps each chunk with its due
// time, and a writer that waits for it and for the partition to heal.
func (r *Relay) pipe(dst, src net.Conn) {
	chunks := make(chan chunk, 64)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				r.mu.Lock()
				latency := r.latency
				r.mu.Unlock()
				chunks <- chunk{b: buf[:n], due: time.Now().Add(latency)}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		// Either side ending ends both.
		dst.Close()
		src.Close()
		for range chunks {
		}
	}()
	for c := range chunks {
		if _, ok := r.gate(); !ok {
			return
		}
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d) // the latency the fault adds
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}
