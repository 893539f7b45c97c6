package idemmem

import "github.com/idem-dev/idem/idemstore"

// Parked reports how many KeyWait calls wait for a change of id.
func Parked(s *Store, id idemstore.Identity) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[id]; ok {
		return w.n
	}
	return 0
}
