package idemgrpc

// HTTPStatus is httpStatus, for the external tests.
var HTTPStatus = httpStatus
