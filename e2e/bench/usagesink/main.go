// Command usagesink is a CloudEvents receiver for the usage-records
// benchmark: it takes every batch POSTed to it, counts the records and
// answers 204, as a metering service that keeps up would. GET /count
// says how many records it has taken.
//
//	usagesink --listen 127.0.0.1:18012
package main

import (
	"bytes"
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18012", "address to take batches on")
	flag.Parse()
	var records atomic.Int64
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// A batch is a JSON array of events, each with one "specversion".
		records.Add(int64(bytes.Count(body, []byte(`"specversion"`))))
		w.WriteHeader(http.StatusNoContent)
	})
	http.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strconv.FormatInt(records.Load(), 10)) //nolint:errcheck // the reader sees a short answer
	})
	log.Fatal(http.ListenAndServe(*listen, nil))
}
