package a

// testOnly is declared in a test file: test files may link it, and
// [TestHelper] too.
func testOnly() {}

// TestHelper is a test helper.
func TestHelper() {}
