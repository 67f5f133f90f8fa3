// Package stripesend delivers billing's export rows to Stripe Billing as
// meter events through the official Go client (stripe-go): one event per
// row, its identifier the row's, so that Stripe, which enforces
// uniqueness of identifiers, never bills a resend twice.
package stripesend

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/ratewarden/ratewarden/metering/billing"
)

// Config configures a Sender.
type Config struct {
	APIKey string // required (STRIPE_API_KEY)
	// URL is the API's base URL; "" = Stripe's. Tests point it at
	// stripe-mock.
	URL string
	// EventRequests and EventCost are the meters' event names of the
	// requests and cost measures; "" = DefaultEventRequests,
	// DefaultEventCost.
	EventRequests, EventCost string
	// Customer is the Stripe customer id of a key; nil = the key itself.
	Customer func(key string) string
	// Timeout bounds each call; 0 = 20 s.
	Timeout time.Duration
}

// Default event names of the two measures.
const (
	DefaultEventRequests = "ratewarden_requests"
	DefaultEventCost     = "ratewarden_cost"
)

// Sender sends rows. Safe for concurrent use.
type Sender struct {
	cfg    Config
	client *stripe.Client
}

var _ billing.Sender = (*Sender)(nil)

// New builds a Sender.
func New(cfg Config) (*Sender, error) {
	if cfg.APIKey == "" {
		return nil, errors.New("stripesend: Config.APIKey is required")
	}
	if cfg.EventRequests == "" {
		cfg.EventRequests = DefaultEventRequests
	}
	if cfg.EventCost == "" {
		cfg.EventCost = DefaultEventCost
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 20 * time.Second
	}
	bc := &stripe.BackendConfig{HTTPClient: &http.Client{Timeout: cfg.Timeout}, MaxNetworkRetries: stripe.Int64(2),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}}
	if cfg.URL != "" {
		bc.URL = stripe.String(cfg.URL)
	}
	api := stripe.GetBackendWithConfig(stripe.APIBackend, bc)
	backends := &stripe.Backends{API: api, Connect: api, Uploads: api, MeterEvents: api}
	return &Sender{cfg: cfg, client: stripe.NewClient(cfg.APIKey, stripe.WithBackends(backends))}, nil
}

// Send creates one meter event per row, in order; it stops at the first
// error. A final period's row is timestamped at the last second of its
// period, an hourly row at its hour, so that Stripe counts each in that
// billing period.
func (s *Sender) Send(ctx context.Context, rows []billing.ExportRow) error {
	for _, r := range rows {
		name := s.cfg.EventRequests
		if r.Measure == billing.MeasureCost {
			name = s.cfg.EventCost
		}
		customer := r.Key
		if s.cfg.Customer != nil {
			customer = s.cfg.Customer(r.Key)
		}
		p, err := billing.ParsePeriod(r.Period, r.TZ)
		if err != nil {
			return err
		}
		_, end := p.Bounds()
		at := end.Unix() - 1
		if r.Line == billing.LineHourly {
			// An hourly row counts at its hour, which lies in its
			// period and not in the future.
			h, err := time.Parse(time.RFC3339, r.Ref)
			if err != nil {
				return fmt.Errorf("stripe meter event %s: the hour %q: %w", r.Identifier, r.Ref, err)
			}
			at = h.Unix()
		}
		params := &stripe.BillingMeterEventCreateParams{EventName: stripe.String(name), Identifier: stripe.String(r.Identifier),
			Timestamp: stripe.Int64(at),
			Payload:   map[string]string{"stripe_customer_id": customer, "value": strconv.FormatInt(r.Value(), 10)}}
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		_, err = s.client.V1BillingMeterEvents.Create(cctx, params)
		cancel()
		if err != nil {
			return fmt.Errorf("stripe meter event %s (%s of %s %s): %w", r.Identifier, r.Measure, r.Key, r.Period, err)
		}
	}
	return nil
}
