package idempgx

// RawDial is rawDial, for the external tests.
var RawDial = rawDial
