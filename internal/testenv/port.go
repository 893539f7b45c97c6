package testenv

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// ServerPort returns a free loopback port for a server a test starts and
// may crash and start again on the same port. It is below the kernel's
// range of ephemeral ports: a port from that range (what listening on :0
// gives) can be taken, while the server is down, by any outgoing
// connection as its local port, and by a client retrying to connect to the
// server, which then connects to itself; the server's restart then fails
// to bind it. Seen in the PostgreSQL fault campaigns under load.
func ServerPort() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const from = 10000
	if low <= from+1000 {
		return anyPort()
	}
	for range 100 {
		port := from + rand.IntN(low-from)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port below the ephemeral range")
}

// anyPort is a free loopback port from the kernel.
func anyPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
