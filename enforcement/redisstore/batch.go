package redisstore

import "context"

// BatchReport receives the size of the batch a decision rode in: how many
// decisions the auto-pipeline sent in the same round trip (Pipelined).
// A caller that wants it (the limiter's store-call span) puts one in the
// decision's context with WithBatchReport; Take fills it before it
// returns, on the caller's goroutine. Calls that did not reach a batch
// (refused, abandoned, a plain Store) leave it unset.
type BatchReport struct {
	// Size is the number of decisions in the batch; 0 when not sent.
	Size int
}

type batchReportKey struct{}

// WithBatchReport returns ctx carrying r for the Take calls made with it.
func WithBatchReport(ctx context.Context, r *BatchReport) context.Context {
	return context.WithValue(ctx, batchReportKey{}, r)
}

// reportBatch fills the BatchReport ctx carries, if any.
func reportBatch(ctx context.Context, size int) {
	if r, ok := ctx.Value(batchReportKey{}).(*BatchReport); ok {
		r.Size = size
	}
}
