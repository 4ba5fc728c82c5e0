module example.com/ws

go 1.26
