package idemamqp

// AtLeast310 is atLeast310, for the tests.
var AtLeast310 = atLeast310
