// Package idemcrypt encrypts stored responses at rest: AES-256-GCM under a
// keyring of named keys, with the record's identity as additional
// authenticated data.
//
//	kr, err := idemcrypt.LoadKeyring("/run/secrets/idem-keys")
//	handler = idem.New(store, &idem.Config{Keyring: kr})(handler)
//
// # What is sealed
//
// A stored response's header values and body are sealed together (one
// nonce, one ciphertext): the database file, the Redis values and dumps, the
// PostgreSQL table and the replay cache (idemcache, which sits below the
// encryption) hold only ciphertext. What stays in the clear is what a store
// must read to decide: the identity (scope, endpoint, key), the
// fingerprint, the state, the token, the times, the status code, and the
// name of the key that sealed the response.
//
// The additional authenticated data is the record's identity, its
// fingerprint and creation time (a Binding), the status and the key name,
// so a ciphertext copied onto another record, an answer saved from an
// earlier record of the same key and planted on a later one (another
// request, or the same request after the record expired), or a status
// changed in the table, fails to open (ErrOpen) instead of replaying an
// answer that is not this record's. Responses sealed by the format v1,
// which bound the identity only, still open; Rotate rewrites them in the
// current format, and Config.Required refuses them.
//
// # Keys
//
// A keys file holds lines NAME:BASE64 (ParseKeyring). The first key seals;
// every key opens. To rotate, put a new key first and keep the old ones,
// deploy it everywhere, run Rotate (`idem keys rotate-encryption`), and drop
// an old key only once Rotate reports nothing left under it. A record under
// a key missing from the keyring is never replayed: the store wrapper
// returns a *KeyError naming the key (never its material) and the
// middleware answers 503 store-unavailable.
//
// A response sealed by the random-nonce GCM of one key should not exceed
// about 2^32 records per key (NIST SP 800-38D): rotate well before.
//
// # Where it sits
//
// New wraps any idemstore.Store: it seals on KeyComplete, KeyResolve and
// transactional completions, and opens on every read. The middleware wraps
// its store with Config.Keyring itself; tools that read or write records
// (idem keys, the console, an idemmaint reconciler that resolves with a
// response) wrap with New. A caching layer (idemcache) goes below New, so
// it caches ciphertext. Completions written by hand in the caller's own
// transaction (idemsqlite.CompleteTx, idempgx.CompleteTx) are stored as
// given: seal them first with Keyring.Seal, for BindingOf the record as
// reserved. A completion through the wrapper that carries the reserved
// record (idemstore.CompleteParams.Record, as the middleware's does) is
// sealed without reading the record; one without it costs one KeyGet.
package idemcrypt
