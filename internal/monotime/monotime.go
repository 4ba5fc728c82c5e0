// Package monotime reads the clock at half the cost of time.Now, for the
// deadlines and trace records on every stage call.
package monotime

import "time"

var base = time.Now()

// Now returns the current time read from the monotonic clock alone: its
// wall-clock reading is the process start's plus the monotonic time
// elapsed since, so it does not follow later changes of the system's wall
// clock. Comparisons and differences between such times (and with
// time.Now's) are exact, as they use the monotonic readings. time.Now
// reads two clocks (wall and monotonic); Now reads one, which matters
// where a stage call reads the clock half a dozen times.
func Now() time.Time { return base.Add(time.Since(base)) }

// Since returns the monotonic time elapsed since the process started: a
// clock reading as an offset, which costs one clock read and no
// arithmetic on time.Time.
func Since() time.Duration { return time.Since(base) }

// Offset converts t to an offset comparable with [Since]. It reads no
// clock when t carries a monotonic reading.
func Offset(t time.Time) time.Duration { return t.Sub(base) }

// At converts an offset back to a time.
func At(offset time.Duration) time.Time { return base.Add(offset) }
