package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"
)

// PostForMetrics posts a chat completions request to base and returns the
// metrics object its response carries (for a stream, on whichever event
// carries it) and the response's id, for looking up the engine's record.
func PostForMetrics(ctx context.Context, client *http.Client, base, body string, stream bool) (metrics, id string, err error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !stream {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", "", err
		}
		return gjson.GetBytes(b, "metrics").Raw, gjson.GetBytes(b, "id").Str, nil
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		id = gjson.Get(data, "id").Str
		if m := gjson.Get(data, "metrics"); m.Exists() {
			metrics = m.Raw
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	if metrics == "" {
		return "", "", errors.New("no metrics in the stream")
	}
	return metrics, id, nil
}
