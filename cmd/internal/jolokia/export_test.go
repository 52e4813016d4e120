package jolokia

// What the tests check that is not part of the API.

var ErrBatchLength = errBatchLength
