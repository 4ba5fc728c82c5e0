//go:build !unix

package fileread

// openNonBlock is 0 where opening a file cannot wait for a writer.
const openNonBlock = 0
